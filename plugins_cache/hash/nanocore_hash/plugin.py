"""Registers the ``hash`` prefix cache with nanocore."""
from nanocore.hookspecs import hookimpl
from nanocore_hash.hash_cache import HashPrefixCache


@hookimpl
def nanocore_prefix_caches():
    return {"hash": HashPrefixCache}
