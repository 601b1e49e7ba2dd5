"""PrefixCacheConformance: a stateful test driving the cache like the BlockManager, against a dict model.

The machine owns ref counts and the free list (as the BlockManager does) and a reference model of
what may be cached: ``prefix tuple -> block``, first publisher wins. The cache may cache less than the
model (``none`` caches nothing) but never something else; blocks it kept (``release`` returned True)
must be matched again and are the only ones ``evict`` may return.
"""
from __future__ import annotations

from typing import Callable, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from nanocore_conformance.base import MAX_EXAMPLES
from nanocore_conformance.contract import BackendContractConformance

ALPHABET = st.integers(0, 2)  # few token values, so prefixes collide often


class BlockManagerModel(RuleBasedStateMachine):
    """Subclassed per test with ``make_cache``, ``block_size`` and ``num_blocks`` set."""

    make_cache: Callable = None
    block_size = 2
    num_blocks = 6

    def __init__(self):
        super().__init__()
        self.cache = self.make_cache()
        self.ref = {b: 0 for b in range(self.num_blocks)}
        self.free = set(range(self.num_blocks))
        self.published: dict[tuple, int] = {}  # prefix -> block the cache may hold for it
        self.prefix_of: dict[int, tuple] = {}
        self.kept: set[int] = set()  # release() returned True and not evicted since
        self.evictable: set[int] = set()
        self.seqs: list[tuple[list[int], list[int]]] = []  # (tokens, blocks), oldest first

    def _prefix(self, tokens, i):
        return tuple(tokens[:(i + 1) * self.block_size])

    def _check_match(self, tokens, matched):
        assert len(matched) * self.block_size <= len(tokens), f"match returned {len(matched)} blocks for {len(tokens)} tokens (full blocks only)"
        assert len(set(matched)) == len(matched), f"match returned a block twice: {matched}"
        for i, block in enumerate(matched):
            expected = self.published.get(self._prefix(tokens, i))
            assert block == expected, (
                f"match({tokens}) returned block {block} at position {i}, but the cache may only hold "
                f"{expected} for that prefix (blocks after eviction or release->False are gone)")
        required = 0  # leading blocks the cache said it keeps must be matched
        while required * self.block_size + self.block_size <= len(tokens):
            block = self.published.get(self._prefix(tokens, required))
            if block is None or block not in self.kept:
                break
            required += 1
        assert len(matched) >= required, (
            f"match({tokens}) returned {len(matched)} blocks but the cache kept the first {required} "
            f"(release returned True for them)")

    def _allocate(self) -> int | None:
        if self.free:
            return self.free.pop()
        block = self.cache.evict()
        self._check_evicted(block)
        return block

    def _check_evicted(self, block):
        if not self.evictable:
            assert block is None, f"evict() returned {block} but no cached block is unreferenced"
            return
        assert block is not None, f"evict() returned None while blocks {sorted(self.evictable)} are evictable"
        assert block in self.evictable, f"evict() returned {block}, which is referenced or not cached (evictable: {sorted(self.evictable)})"
        self.evictable.discard(block)
        self.kept.discard(block)
        self.published.pop(self.prefix_of.pop(block), None)

    @rule(tokens=st.lists(ALPHABET, max_size=9), data=st.data())
    def start_sequence(self, tokens, data):
        matched = self.cache.match(tokens)
        self._check_match(tokens, matched)
        for block in matched:
            if self.ref[block] == 0:
                self.evictable.discard(block)
                self.cache.acquire(block)
            self.ref[block] += 1
        blocks = list(matched)
        for _ in range(len(tokens) // self.block_size - len(matched)):
            block = self._allocate()
            if block is None:
                break  # out of KV blocks: the sequence keeps what it has
            self.ref[block] += 1
            blocks.append(block)
        self.seqs.append((tokens, blocks))
        self._insert(tokens, blocks, data.draw(st.integers(len(matched), len(blocks))))

    def _insert(self, tokens, blocks, num_computed):
        self.cache.insert(tokens, blocks[:num_computed])
        for i, block in enumerate(blocks[:num_computed]):
            prefix = self._prefix(tokens, i)
            if prefix not in self.published and block not in self.prefix_of:
                self.published[prefix] = block
                self.prefix_of[block] = prefix

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def compute_rest(self, data):
        tokens, blocks = self.seqs[data.draw(st.integers(0, len(self.seqs) - 1))]
        self._insert(tokens, blocks, len(blocks))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish_sequence(self, data):
        tokens, blocks = self.seqs.pop(data.draw(st.integers(0, len(self.seqs) - 1)))
        for block in reversed(blocks):  # tail blocks first, as the BlockManager frees them
            self.ref[block] -= 1
            if self.ref[block]:
                continue
            if self.cache.release(block):
                assert block in self.prefix_of, f"release({block}) returned True for a block that holds no published prefix"
                self.kept.add(block)
                self.evictable.add(block)
            else:
                self.kept.discard(block)
                self.published.pop(self.prefix_of.pop(block, None), None)
                self.free.add(block)

    @rule()
    def evict_one(self):
        block = self.cache.evict()
        self._check_evicted(block)
        if block is not None:
            self.free.add(block)

    @rule(tokens=st.lists(ALPHABET, max_size=9))
    def match_only(self, tokens):
        self._check_match(tokens, self.cache.match(tokens))

    @invariant()
    def stats_are_numbers(self):
        stats = self.cache.stats()
        assert isinstance(stats, dict) and all(isinstance(v, (int, float)) for v in stats.values()), (
            f"stats() must return a dict of numbers, got {stats!r}")


class PrefixCacheConformance(BackendContractConformance):
    kind = "prefix_cache"
    block_sizes: ClassVar[tuple[int, ...]] = (1, 2, 4)
    num_blocks: ClassVar[int] = 6
    stateful_steps: ClassVar[int] = 40

    def test_constructs(self, backend_cls, backend_options):
        cache = backend_cls(16, 8, backend_options)
        assert (cache.block_size, cache.num_blocks) == (16, 8), "call PrefixCache.__init__(block_size, num_blocks, options)"

    def test_stateful_against_reference_model(self, backend_cls, backend_options):
        for block_size in self.block_sizes:
            machine = type("PrefixCacheMachine", (BlockManagerModel,), {
                "make_cache": staticmethod(lambda bs=block_size: backend_cls(bs, self.num_blocks, backend_options)),
                "block_size": block_size, "num_blocks": self.num_blocks,
            })
            run_state_machine_as_test(machine, settings=settings(
                max_examples=MAX_EXAMPLES, stateful_step_count=self.stateful_steps, deadline=None))
