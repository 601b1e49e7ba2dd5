"""PrefixCache: which KV blocks can be reused by a new request with the same token prefix.

Works on full blocks only. The BlockManager owns reference counts and the free list; the cache
only remembers which block holds which token prefix and in what order unreferenced cached blocks
should be evicted. Life of a cached block:

    insert (computed, referenced) -> release (ref count reached 0: evictable)
    -> acquire (matched again: not evictable) or evict (the block is reused for other tokens)

Rules the conformance suite checks with a stateful model of the BlockManager:
- A block is identified by its whole prefix: block ``i`` of a sequence matches only a sequence with the same
  tokens ``[0, (i+1)*block_size)``, every token of the block and every token before it (chain the hash of the
  parent block with all of this block's tokens; verify on a hit if hashes can collide).
- ``evict`` returns only blocks that were released and not acquired since; a referenced block is never evicted.
  An evicted block is forgotten at once: ``match`` never returns it again.
- ``release`` returns True only for blocks the cache holds (published by ``insert``).
- Calls come from the engine's scheduler thread, a few per sequence per step: keep them O(blocks touched).

Constructor: ``__init__(self, block_size, num_blocks, options=None)``, called positionally by the registry with
the engine's block size (16 by default) and the number of KV blocks.

``conformance_requirements`` a cache may declare (a class attribute dict, applied by every conformance class):
``{"block_sizes": (16,)}`` (default (16, 32)); ``num_blocks`` / ``max_seq_blocks`` / ``stateful_steps`` size the
stateful run (14, 6, 30). Rules a cache declares (each checked by its own case):
- ``keeps_inserted_blocks`` (default True): every block ``insert`` publishes for a prefix no cached block holds is
  kept until ``evict`` returns it: ``release`` returns True for it and ``match`` returns it whenever it returns the
  blocks before it. ``False`` for a cache that keeps only some blocks by design (``none`` keeps none).
- ``forgets_evicted_blocks`` (default True): once ``evict`` has returned every block, the cache holds no more state
  than when it was first emptied, and acquiring and releasing the same blocks again and again does not grow it.
  ``False`` for a cache that keeps (bounded) history of evicted blocks.
- ``block_hash`` (default None): the name of a class attribute holding the cache's block-key function
  ``(parent_key: int, token_ids: tuple[int, ...]) -> int``; the suite replaces it with one that gives every block the
  same key, and every hit must still hold exactly the queried prefix.
- ``incremental_insert`` (default False): ``insert`` of a sequence whose first blocks are cached reads the token ids
  of at most one cached block besides those of the blocks it adds (``published_prefix`` in the toolkit does this).
- ``evicts_least_recently_released`` (default False): ``evict`` never returns a block while an idle kept block
  released earlier holds no prefix of another live block (LRU over all released blocks, or over leaves, keep it).
- ``rejects_reused_blocks`` (default False): ``insert`` of a block id the cache holds for other tokens (a caller's
  bug) raises ValueError instead of chaining later blocks to it.
- ``stats()`` may report any numbers; the counter names of ``nanocore.toolkit.prefix_cache.PrefixCacheCounters``
  (``queries``, ``query_blocks``, ``hit_blocks``, ``evictions``, ``cached_blocks``, ``evictable_blocks``,
  ``block_hit_rate``) mean what it counts wherever a cache reports them.

``keeps_inserted_blocks``, ``forgets_evicted_blocks`` and the ``stats()`` counters are rules of plugin API 1.6: a
cache targeting an older API is held to neither (hits must still be right) and is warned to declare 1.6.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Sequence

from nanocore.interfaces.base import Backend


class PrefixCache(Backend):
    def __init__(self, block_size: int, num_blocks: int, options: dict | None = None):
        super().__init__(options)
        self.block_size = block_size
        self.num_blocks = num_blocks

    @abstractmethod
    def match(self, token_ids: Sequence[int]) -> list[int]:
        """Block ids holding the longest cached prefix of ``token_ids`` (full blocks only)."""

    @abstractmethod
    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        """Publish computed blocks: ``block_ids[i]`` holds tokens ``[i*bs, (i+1)*bs)`` of ``token_ids``.

        ``len(token_ids) >= len(block_ids) * block_size``; blocks already published are left as they are.
        """

    @abstractmethod
    def acquire(self, block_id: int) -> None:
        """A matched block got a reference again: it must not be evicted."""

    @abstractmethod
    def release(self, block_id: int) -> bool:
        """A block's reference count reached 0. Return True if the cache keeps it (evictable), False
        if it is not cached (the BlockManager puts it on the free list)."""

    @abstractmethod
    def evict(self) -> int | None:
        """Forget the next evictable block and return its id, or None if none is evictable."""

    def stats(self) -> dict[str, float]:
        """Counters for the engine's stats (cached blocks, evictions, ...)."""
        return {}
