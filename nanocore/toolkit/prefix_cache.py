"""Pieces every block-level prefix cache needs: full-block splitting, the LRU of evictable blocks,
and the counters behind ``PrefixCache.stats()``."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Sequence


def full_blocks(token_ids: Sequence[int], block_size: int, limit: int | None = None) -> list[tuple[int, ...]]:
    """The token ids of each full block of ``token_ids`` (at most ``limit`` blocks), as tuples."""
    num_blocks = len(token_ids) // block_size
    if limit is not None:
        num_blocks = min(num_blocks, limit)
    return [tuple(token_ids[i * block_size:(i + 1) * block_size]) for i in range(num_blocks)]


def check_insert(token_ids: Sequence[int], block_ids: Sequence[int], block_size: int, num_blocks: int) -> None:
    """Reject ``insert`` arguments that break the PrefixCache contract, saying what is wrong."""
    if len(token_ids) < len(block_ids) * block_size:
        raise ValueError(
            f"insert got {len(block_ids)} block ids but only {len(token_ids)} token ids; each block needs "
            f"{block_size} computed tokens (pass only the ids of full, computed blocks)"
        )
    bad = [b for b in block_ids if not 0 <= b < num_blocks]
    if bad:
        raise ValueError(f"insert got block ids {bad} outside [0, {num_blocks}); pass ids the BlockManager allocated")


def published_prefix(token_ids: Sequence[int], block_ids: Sequence[int], block_size: int,
                     by_block: dict) -> tuple[int, object | None]:
    """(index of the first block ``insert`` still has to add, the cached node of the block before it).

    The BlockManager publishes a sequence one new block at a time, so ``insert`` resumes after the last of
    its blocks already cached for these tokens (``by_block``: block id -> node with ``token_ids``) instead of
    walking the whole prefix again: a block's KV depends on its whole prefix, so its node is on this path."""
    for i in reversed(range(len(block_ids))):
        node = by_block.get(block_ids[i])
        if node is not None and node.token_ids == tuple(token_ids[i * block_size:(i + 1) * block_size]):
            return i + 1, node
    return 0, None


class EvictableLRU:
    """Blocks that may be evicted, popped least recently used first.

    Each block carries a stamp (its last release time); a block may be re-added with an older stamp
    (the radix tree does this when an inner node becomes a leaf), hence a heap with lazy deletion.
    """

    def __init__(self) -> None:
        self._stamps: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self._clock = itertools.count()

    def now(self) -> int:
        """A fresh stamp, later than every stamp handed out before."""
        return next(self._clock)

    def add(self, block_id: int, stamp: int | None = None) -> None:
        stamp = self.now() if stamp is None else stamp
        self._stamps[block_id] = stamp
        heapq.heappush(self._heap, (stamp, block_id))
        if len(self._heap) > 2 * len(self._stamps):
            self._compact()  # stale heap entries from discards would otherwise pile up

    def discard(self, block_id: int) -> None:
        self._stamps.pop(block_id, None)

    def pop_oldest(self) -> int | None:
        while self._heap:
            stamp, block_id = heapq.heappop(self._heap)
            if self._stamps.get(block_id) == stamp:
                del self._stamps[block_id]
                return block_id
        return None

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._stamps

    def __len__(self) -> int:
        return len(self._stamps)

    def _compact(self) -> None:
        self._heap = [(s, b) for b, s in self._stamps.items()]
        heapq.heapify(self._heap)


@dataclass
class PrefixCacheCounters:
    """Counters reported by ``stats()``; ``queries`` / ``hit_blocks`` count ``match`` calls."""

    queries: int = 0
    query_blocks: int = 0
    hit_blocks: int = 0
    evictions: int = 0

    def record_match(self, num_query_blocks: int, num_hit_blocks: int) -> None:
        self.queries += 1
        self.query_blocks += num_query_blocks
        self.hit_blocks += num_hit_blocks

    def as_stats(self, cached_blocks: int, evictable_blocks: int) -> dict[str, float]:
        return {
            "cached_blocks": cached_blocks,
            "evictable_blocks": evictable_blocks,
            "evictions": self.evictions,
            "queries": self.queries,
            "query_blocks": self.query_blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": self.hit_blocks / self.query_blocks if self.query_blocks else 0.0,
        }
