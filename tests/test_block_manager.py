"""BlockManager: ref counts, free list, exhaustion as a return value, prefix-cache hooks."""
from __future__ import annotations

import pytest

from nanocore.builtin.no_prefix_cache import NoPrefixCache
from nanocore.engine.block_manager import BlockManager
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.sequence import Sequence
from nanocore.interfaces import PrefixCache


class RecordingCache(PrefixCache):
    """Exact-prefix dict cache that records every hook call."""

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, options)
        self.by_prefix: dict[tuple, int] = {}
        self.idle: list[int] = []
        self.calls: list[tuple] = []

    def match(self, token_ids):
        self.calls.append(("match", len(token_ids)))
        hits = []
        for i in range(len(token_ids) // self.block_size):
            block = self.by_prefix.get(tuple(token_ids[:(i + 1) * self.block_size]))
            if block is None:
                break
            hits.append(block)
        return hits

    def insert(self, token_ids, block_ids):
        self.calls.append(("insert", list(block_ids)))
        for i, block in enumerate(block_ids):
            self.by_prefix.setdefault(tuple(token_ids[:(i + 1) * self.block_size]), block)

    def acquire(self, block_id):
        self.calls.append(("acquire", block_id))
        self.idle.remove(block_id)

    def release(self, block_id):
        self.calls.append(("release", block_id))
        if block_id in self.by_prefix.values():
            self.idle.append(block_id)
            return True
        return False

    def evict(self):
        if not self.idle:
            return None
        block = self.idle.pop(0)
        self.by_prefix = {k: v for k, v in self.by_prefix.items() if v != block}
        self.calls.append(("evict", block))
        return block


def seq(tokens, seq_id=0):
    return Sequence(seq_id, seq_id, list(tokens), SamplingParams(), max_tokens=8)


def test_allocate_and_free_keep_ref_counts_and_free_list():
    bm = BlockManager(8, 4, NoPrefixCache(4, 8))
    a, b = seq(range(10)), seq(range(3), 1)
    assert bm.allocate(a, 10) and a.block_table == [0, 1, 2]
    assert bm.allocate(b, 3) and b.block_table == [3]
    assert bm.num_free_blocks == 4 and bm.ref_counts[:4] == [1, 1, 1, 1]
    assert bm.allocate(a, 12) and a.num_blocks == 3  # still fits in block 2
    assert bm.allocate(a, 13) and a.num_blocks == 4
    bm.free(a)
    assert a.block_table == [] and a.num_computed_tokens == 0
    assert bm.num_free_blocks == 7 and bm.ref_counts == [0, 0, 0, 1, 0, 0, 0, 0]


def test_exhaustion_is_a_return_value_and_changes_nothing():
    bm = BlockManager(4, 4, NoPrefixCache(4, 4))
    a, b = seq(range(12)), seq(range(8), 1)
    assert bm.allocate(a, 12)
    assert bm.allocate(b, 8) is False
    assert b.block_table == [] and bm.num_free_blocks == 1
    assert bm.allocate(b, 4) and bm.num_free_blocks == 0


def test_prefix_hooks_match_publish_release_acquire_evict():
    cache = RecordingCache(4, 6)
    bm = BlockManager(6, 4, cache)
    a = seq(range(9))
    assert bm.match_prefix(a) == 0
    assert bm.allocate(a, 9)
    a.num_computed_tokens = 6  # a chunk: one full block computed
    bm.publish(a)
    assert cache.calls[-1] == ("insert", [0])
    a.num_computed_tokens = 9
    bm.publish(a)
    assert cache.calls[-1] == ("insert", [0, 1])
    bm.publish(a)  # nothing new: no call
    assert cache.calls[-1] == ("insert", [0, 1])
    bm.free(a)  # blocks 0, 1 stay cached (evictable), block 2 goes to the free list
    assert bm.evictable == {0, 1} and bm.num_free_blocks == 6

    b = seq(range(9), 1)
    assert bm.match_prefix(b) == 8  # (9 - 1) // 4 = 2 blocks
    assert b.block_table == [0, 1] and b.num_computed_tokens == 8
    assert ("acquire", 0) in cache.calls and ("acquire", 1) in cache.calls
    assert bm.ref_counts[0] == bm.ref_counts[1] == 1 and not bm.evictable

    c = seq(range(8), 2)  # full-prompt hit: the last token is recomputed, so only one block matches
    assert bm.match_prefix(c) == 4 and c.block_table == [0]
    assert bm.ref_counts[0] == 2
    assert cache.calls.count(("acquire", 0)) == 1  # acquire only when a block gets referenced again


def test_allocation_evicts_cached_blocks_after_the_free_list():
    cache = RecordingCache(4, 3)
    bm = BlockManager(3, 4, cache)
    a = seq(range(8))
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.publish(a)
    bm.free(a)
    assert bm.num_free_blocks == 3 and bm.evictable == {0, 1}
    b = seq(range(100, 112), 1)
    assert bm.allocate(b, 12)
    assert b.block_table[0] == 2  # the free list first
    assert [c for c in cache.calls if c[0] == "evict"] == [("evict", 1), ("evict", 0)]


def test_zero_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(0, 16, NoPrefixCache(16, 0))
