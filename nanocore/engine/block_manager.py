"""Paged KV-cache bookkeeping: reference counts, the free list and the prefix-cache hooks.

A block is in exactly one of three states: referenced (ref count > 0), idle but kept by the prefix
cache (evictable), or free. Allocation takes the free list first, then asks the cache to evict.
Running out of blocks is a return value, never an assert: the scheduler preempts.
"""
from __future__ import annotations

from collections import deque

from nanocore.engine.sequence import Sequence
from nanocore.interfaces import PrefixCache


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: PrefixCache):
        if num_blocks < 1:
            raise ValueError(f"the KV cache must hold at least one block, got num_blocks={num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.ref_counts = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.evictable: set[int] = set()  # ref count 0, still held by the prefix cache
        self.peak_used_blocks = 0  # most blocks referenced at once, seen at allocations (benchmarks reset it)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can get: free ones plus idle cached ones (an upper bound: a cache may
        evict some idle blocks only after others, e.g. radix inner nodes after their children)."""
        return len(self.free_blocks) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by sequences (neither free nor idle in the prefix cache)."""
        return self.num_blocks - len(self.free_blocks) - len(self.evictable)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs so its table covers its first ``num_tokens`` tokens."""
        return max(0, -(-num_tokens // self.block_size) - seq.num_blocks)

    def match_prefix(self, seq: Sequence, max_tokens: int | None = None) -> int:
        """Reuse cached blocks for a sequence holding none; return the number of cached tokens.

        At most ``(num_tokens - 1) // block_size`` blocks: the last token is always recomputed so the
        step produces logits to sample from. ``max_tokens``: serve at most that many (prompt logprobs
        need their positions computed).
        """
        assert seq.num_blocks == 0 and seq.num_computed_tokens == 0, "match_prefix is for sequences without KV"
        max_blocks = (min(seq.num_tokens - 1, seq.num_tokens if max_tokens is None else max_tokens)
                      // self.block_size)
        if max_blocks == 0:
            return 0
        matched = list(self.prefix_cache.match(seq.token_ids[:max_blocks * self.block_size]))[:max_blocks]
        for block_id in matched:
            self._add_ref(block_id)
        seq.block_table = matched
        seq.num_computed_tokens = seq.num_published_blocks = len(matched)
        seq.num_computed_tokens *= self.block_size
        return seq.num_computed_tokens

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow ``seq``'s block table to cover ``num_tokens`` tokens; False (and no change) if KV is exhausted."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            return False
        taken: list[int] = []
        for _ in range(needed):
            block_id = self._take_block()
            if block_id is None:  # the cache keeps some idle blocks unevictable for now (radix inner nodes)
                self.free_blocks.extend(taken)
                return False
            taken.append(block_id)
        for block_id in taken:
            self.ref_counts[block_id] = 1
        seq.block_table.extend(taken)
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        return True

    def free(self, seq: Sequence) -> None:
        """Drop all of ``seq``'s blocks (finish or preemption); its KV must be recomputed."""
        for block_id in reversed(seq.block_table):  # tail blocks first: a prefix outlives its suffix
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_published_blocks = 0

    def trim(self, seq: Sequence, num_blocks: int) -> None:
        """Give back the blocks past ``seq``'s first ``num_blocks`` (never published: beyond its computed KV)."""
        assert num_blocks >= seq.num_published_blocks, "trim would drop blocks the prefix cache holds"
        for block_id in reversed(seq.block_table[num_blocks:]):
            self._release(block_id)
        # a new list, never a shrunk one: a plan already handed to the runner keeps the table it planned with
        seq.block_table = seq.block_table[:num_blocks]

    def publish(self, seq: Sequence) -> None:
        """Insert ``seq``'s newly computed full blocks into the prefix cache."""
        num_full = min(seq.num_computed_tokens // self.block_size, seq.num_blocks)
        if num_full > seq.num_published_blocks:
            self.prefix_cache.insert(seq.token_ids[:num_full * self.block_size], seq.block_table[:num_full])
            seq.num_published_blocks = num_full

    def _add_ref(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            assert block_id in self.evictable, f"prefix cache matched block {block_id}, which it does not hold"
            self.evictable.discard(block_id)
            self.prefix_cache.acquire(block_id)
        self.ref_counts[block_id] += 1

    def _release(self, block_id: int) -> None:
        assert self.ref_counts[block_id] > 0, f"block {block_id} released more often than referenced"
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            if self.prefix_cache.release(block_id):
                self.evictable.add(block_id)
            else:
                self.free_blocks.append(block_id)

    def _take_block(self) -> int | None:
        if self.free_blocks:
            return self.free_blocks.popleft()
        block_id = self.prefix_cache.evict()
        if block_id is None:
            return None
        assert block_id in self.evictable, (
            f"prefix cache {type(self.prefix_cache).__name__} evicted block {block_id}, which is not idle")
        self.evictable.discard(block_id)
        return block_id

    def stats(self) -> dict[str, float]:
        return {"num_free_blocks": len(self.free_blocks), "num_evictable_blocks": len(self.evictable),
                **self.prefix_cache.stats()}
