"""``none``: no prefix caching; every block goes straight back to the free list."""
from __future__ import annotations

from nanocore.interfaces import PrefixCache, builtin_options


class NoPrefixCache(PrefixCache):
    auto_priority = 0
    conformance_requirements = {"keeps_inserted_blocks": False}  # caching nothing is its purpose

    def __init__(self, block_size: int, num_blocks: int, options: dict | None = None):
        super().__init__(block_size, num_blocks, builtin_options(self, NoPrefixCache, "none", options, {}))

    def match(self, token_ids):
        return []

    def insert(self, token_ids, block_ids):
        return None

    def acquire(self, block_id):
        raise AssertionError("the 'none' prefix cache never returns blocks, so none can be acquired")

    def release(self, block_id):
        return False

    def evict(self):
        return None
