"""A dumb, obviously-correct reference model of a block-level prefix cache, and a hypothesis state
machine that drives a real backend and the model side by side through a simulated BlockManager.

The simulation also tracks the ground truth of every physical block (the token prefix whose KV it holds,
``None`` while uncomputed), so a stale or uncomputed block returned by ``match`` fails independently of
the model. Used by the hash and radix plugins' tests for their exact eviction order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nanocore.interfaces import PrefixCache


@dataclass
class RefBlock:
    block_id: int
    prefix: tuple[int, ...]  # every token up to the end of this block
    released: bool = False
    last_released: int = 0


class ReferencePrefixCache:
    """A dict from token prefix to block, first publisher wins. ``leaves_only``: evict only blocks whose
    prefix no other cached block extends (radix); otherwise any released block (hash)."""

    def __init__(self, block_size: int, leaves_only: bool):
        self.block_size = block_size
        self.leaves_only = leaves_only
        self.blocks: dict[int, RefBlock] = {}
        self._clock = itertools.count(1)

    def _by_prefix(self) -> dict[tuple[int, ...], RefBlock]:
        return {b.prefix: b for b in self.blocks.values()}

    def match(self, token_ids: Sequence[int]) -> list[int]:
        by_prefix, hits = self._by_prefix(), []
        for end in range(self.block_size, len(token_ids) + 1, self.block_size):
            block = by_prefix.get(tuple(token_ids[:end]))
            if block is None:
                break
            hits.append(block.block_id)
        return hits

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        by_prefix = self._by_prefix()
        for i, block_id in enumerate(block_ids):
            prefix = tuple(token_ids[:(i + 1) * self.block_size])
            if prefix not in by_prefix:
                assert block_id not in self.blocks, "the simulation never re-inserts a cached block"
                self.blocks[block_id] = by_prefix[prefix] = RefBlock(block_id, prefix)

    def acquire(self, block_id: int) -> None:
        self.blocks[block_id].released = False

    def release(self, block_id: int) -> bool:
        block = self.blocks.get(block_id)
        if block is None:
            return False
        block.released, block.last_released = True, next(self._clock)
        return True

    def evictable(self) -> list[RefBlock]:
        parents = {b.prefix[:-self.block_size] for b in self.blocks.values()}
        return [b for b in self.blocks.values()
                if b.released and not (self.leaves_only and b.prefix in parents)]

    def evict(self) -> int | None:
        candidates = self.evictable()
        if not candidates:
            return None
        victim = min(candidates, key=lambda b: b.last_released)
        del self.blocks[victim.block_id]
        return victim.block_id


@dataclass
class SimSequence:
    token_ids: tuple[int, ...]
    block_ids: list[int]
    num_computed_blocks: int
    num_inserted_blocks: int = 0


@dataclass
class BlockManagerSim:
    """Reference counts, free list and the true content of each block, as the engine keeps them."""

    cache: PrefixCache
    model: ReferencePrefixCache
    num_blocks: int
    ref_counts: dict[int, int] = field(default_factory=dict)
    content: dict[int, tuple[int, ...] | None] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.free = list(range(self.num_blocks))

    def match(self, token_ids: Sequence[int]) -> list[int]:
        hits = self.cache.match(token_ids)
        assert hits == self.model.match(token_ids), f"match({list(token_ids)}): got {hits}"
        bs = self.cache.block_size
        for i, block_id in enumerate(hits):
            assert self.content.get(block_id) == tuple(token_ids[:(i + 1) * bs]), (
                f"match returned block {block_id} holding {self.content.get(block_id)} (stale or uncomputed)")
        return hits

    def evict(self) -> int | None:
        block_id = self.cache.evict()
        assert block_id == self.model.evict(), f"evict() returned {block_id}, the model evicts otherwise"
        if block_id is not None:
            assert self.ref_counts.get(block_id, 0) == 0, f"evicted block {block_id} is still referenced"
            self.content[block_id] = None
            self.free.append(block_id)
        return block_id

    def allocate(self) -> int | None:
        if not self.free and self.evict() is None:
            return None
        block_id = self.free.pop(0)
        self.content[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def reference(self, block_id: int) -> None:
        if self.ref_counts.get(block_id, 0) == 0:
            self.cache.acquire(block_id)
            self.model.acquire(block_id)
        self.ref_counts[block_id] = self.ref_counts.get(block_id, 0) + 1

    def dereference(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            kept = self.cache.release(block_id)
            assert kept == self.model.release(block_id), f"release({block_id}) returned {kept}"
            if not kept:
                self.free.append(block_id)

    def start(self, token_ids: tuple[int, ...]) -> SimSequence | None:
        bs = self.cache.block_size
        hits = self.match(token_ids)
        for block_id in hits:
            self.reference(block_id)
        block_ids = list(hits)
        while len(block_ids) < len(token_ids) // bs:
            block_id = self.allocate()
            if block_id is None:  # out of memory: give everything back, as a preempted request would
                for b in reversed(block_ids):
                    self.dereference(b)
                return None
            block_ids.append(block_id)
        return SimSequence(token_ids, block_ids, num_computed_blocks=len(hits))

    def compute(self, seq: SimSequence, num_blocks: int) -> None:
        """Compute the next ``num_blocks`` blocks (a prefill chunk) and publish every computed block."""
        bs = self.cache.block_size
        end = min(len(seq.block_ids), seq.num_computed_blocks + num_blocks)
        for i in range(seq.num_computed_blocks, end):
            self.content[seq.block_ids[i]] = seq.token_ids[:(i + 1) * bs]
        seq.num_computed_blocks = end
        self.cache.insert(seq.token_ids, seq.block_ids[:end])
        self.model.insert(seq.token_ids, seq.block_ids[:end])

    def finish(self, seq: SimSequence) -> None:
        for block_id in reversed(seq.block_ids):  # last blocks first, as the engine frees them
            self.dereference(block_id)


TOKENS = st.lists(st.integers(0, 2), min_size=0, max_size=12).map(tuple)


def prefix_cache_machine(make_cache: Callable[[int, int], PrefixCache], leaves_only: bool,
                         block_size: int = 2, num_blocks: int = 10) -> type[RuleBasedStateMachine]:
    """A state machine class running ``make_cache(block_size, num_blocks)`` against the reference model.

    Tokens come from a 3-letter alphabet and blocks are tiny, so sibling blocks share first tokens,
    prefixes are shared constantly and memory pressure forces evictions.
    """

    class PrefixCacheMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.sim = BlockManagerSim(make_cache(block_size, num_blocks),
                                       ReferencePrefixCache(block_size, leaves_only), num_blocks)
            self.running: list[SimSequence] = []

        @rule(token_ids=TOKENS)
        def match_only(self, token_ids):
            self.sim.match(token_ids)

        @rule(token_ids=TOKENS, chunk=st.integers(1, 6))
        def start_sequence(self, token_ids, chunk):
            seq = self.sim.start(token_ids)
            if seq is not None:
                self.sim.compute(seq, chunk)
                self.running.append(seq)

        @precondition(lambda self: self.running)
        @rule(index=st.integers(0, 50), chunk=st.integers(1, 6))
        def compute_chunk(self, index, chunk):
            self.sim.compute(self.running[index % len(self.running)], chunk)

        @precondition(lambda self: self.running)
        @rule(index=st.integers(0, 50))
        def finish_sequence(self, index):
            self.sim.finish(self.running.pop(index % len(self.running)))

        @rule()
        def evict(self):
            self.sim.evict()

        @invariant()
        def stats_agree(self):
            stats = self.sim.cache.stats()
            assert stats["cached_blocks"] == len(self.sim.model.blocks), stats
            assert stats["evictable_blocks"] == len(self.sim.model.evictable()), stats

        @invariant()
        def no_block_lost(self):
            held = {b for b, n in self.sim.ref_counts.items() if n > 0}
            cached = set(self.sim.model.blocks)
            assert held | cached | set(self.sim.free) == set(range(num_blocks)), "a block leaked"
            assert not set(self.sim.free) & (held | cached), "a free block is also in use"

    return PrefixCacheMachine


OPS = st.lists(st.one_of(
    st.tuples(st.just("start"), TOKENS, st.integers(1, 6)),
    st.tuples(st.just("compute"), st.integers(0, 50), st.integers(1, 6)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("match"), TOKENS),
), max_size=40)


def replay(make_cache: Callable[[int, int], PrefixCache], ops: list[tuple], leaves_only: bool,
           block_size: int = 2, num_blocks: int = 256) -> list[list[int]]:
    """Run an operation stream (see ``OPS``) and return the hits of every ``match``, in order."""
    sim = BlockManagerSim(make_cache(block_size, num_blocks), ReferencePrefixCache(block_size, leaves_only), num_blocks)
    running: list[SimSequence] = []
    hits: list[list[int]] = []
    for op, *args in ops:
        if op == "match":
            hits.append(sim.match(args[0]))
        elif op == "start":
            seq = sim.start(args[0])
            hits.append(seq.block_ids[:seq.num_computed_blocks] if seq else [])
            if seq is not None:
                sim.compute(seq, args[1])
                running.append(seq)
        elif running and op == "compute":
            sim.compute(running[args[0] % len(running)], args[1])
        elif running and op == "finish":
            sim.finish(running.pop(args[0] % len(running)))
    return hits
