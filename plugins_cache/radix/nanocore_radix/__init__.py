"""``radix`` prefix cache for nanocore: a block-level radix tree that evicts unreferenced leaves (LRU)."""
from nanocore_radix.radix_cache import RadixPrefixCache

__all__ = ["RadixPrefixCache"]
