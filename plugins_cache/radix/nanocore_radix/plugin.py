"""Registers the ``radix`` prefix cache with nanocore."""
from nanocore.hookspecs import hookimpl
from nanocore_radix.radix_cache import RadixPrefixCache


@hookimpl
def nanocore_prefix_caches():
    return {"radix": RadixPrefixCache}
