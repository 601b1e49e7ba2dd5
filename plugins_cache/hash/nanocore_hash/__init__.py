"""``hash`` prefix cache for nanocore: chained xxhash64 over full blocks, LRU reuse of released blocks."""
from nanocore_hash.hash_cache import HashPrefixCache

__all__ = ["HashPrefixCache"]
