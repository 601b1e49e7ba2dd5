"""A hypothesis state machine that drives a prefix cache the way the BlockManager does.

The machine owns reference counts and the free list, and the ground truth of every physical block: the
token prefix whose KV it holds (``None`` while uncomputed or once it went back to the free list). Checks
hold for every correct cache, whatever it chooses to keep: a matched block holds exactly the queried
prefix; blocks the cache said it keeps (``release`` returned True) are matched again and are the only
ones ``evict`` may return, never while a sequence references them.

Sequences are cut from a few long random documents at realistic block sizes, so prefixes are shared
for many blocks and diverge at block boundaries, inside a block (first, middle, last token) or not at all.
"""
from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

VOCAB = 32000
NUM_DOCUMENTS = 3


class BlockManagerModel(RuleBasedStateMachine):
    """Subclassed per run with ``make_cache``, ``block_size``, ``num_blocks`` and ``max_seq_blocks`` set."""

    make_cache: Callable = None
    block_size = 16
    num_blocks = 14
    max_seq_blocks = 6

    def __init__(self):
        super().__init__()
        self.cache = self.make_cache()
        self.ref = {b: 0 for b in range(self.num_blocks)}
        self.free = list(range(self.num_blocks))
        self.content: dict[int, tuple | None] = {b: None for b in range(self.num_blocks)}
        self.inserted: set[int] = set()  # passed to insert() since last allocated
        self.kept: set[int] = set()  # release() returned True and not evicted since
        self.seqs: list[tuple[list[int], list[int]]] = []  # (tokens, blocks), oldest first
        self.documents: list[list[int]] = []

    @initialize(seed=st.integers(0, 2**32 - 1))
    def make_documents(self, seed):
        rng = random.Random(seed)
        length = (self.max_seq_blocks + 1) * self.block_size
        self.documents = [[rng.randrange(1, VOCAB) for _ in range(length)] for _ in range(NUM_DOCUMENTS)]

    def _draw_tokens(self, data) -> list[int]:
        """A document prefix ending on or inside a block, optionally changed at one token (a sibling)."""
        bs = self.block_size
        tokens = list(self.documents[data.draw(st.integers(0, NUM_DOCUMENTS - 1), "document")])
        full = data.draw(st.integers(0, self.max_seq_blocks), "full_blocks")
        tail = data.draw(st.sampled_from([0, 1, bs // 2, bs - 1]), "tail_tokens")
        tokens = tokens[:full * bs + tail]
        if tokens and data.draw(st.booleans(), "diverge"):
            block = data.draw(st.integers(0, (len(tokens) - 1) // bs), "diverging_block")
            offset = data.draw(st.sampled_from([0, 1, bs // 2, bs - 1]), "diverging_offset")
            position = min(block * bs + offset, len(tokens) - 1)
            tokens[position] = (tokens[position] + data.draw(st.integers(1, 2))) % VOCAB
        return tokens

    def _prefix(self, tokens, i) -> tuple:
        return tuple(tokens[:(i + 1) * self.block_size])

    def _check_match(self, tokens, matched) -> None:
        bs = self.block_size
        assert len(matched) * bs <= len(tokens), (
            f"match() of {len(tokens)} tokens returned {len(matched)} blocks of {bs}: match returns full blocks only")
        assert len(set(matched)) == len(matched), f"match() returned a block twice: {matched}"
        for i, block in enumerate(matched):
            held = self.content.get(block)
            assert held == self._prefix(tokens, i), (
                f"match() returned block {block} for tokens [{i * bs}, {(i + 1) * bs}) but that block holds KV of "
                f"{'nothing (it was evicted, freed or never computed)' if held is None else 'other tokens'}; a "
                f"block matches only if its own tokens and every token before them are equal")
            assert self.ref[block] or block in self.kept, (
                f"match() returned block {block}, which the cache gave back (release returned False or evict "
                f"returned it); forget blocks you do not keep")
        required = 0
        kept_prefixes = {self.content[b] for b in self.kept}
        while (required + 1) * bs <= len(tokens) and self._prefix(tokens, required) in kept_prefixes:
            required += 1
        assert len(matched) >= required, (
            f"match() returned {len(matched)} blocks but the cache keeps the first {required} blocks of these "
            f"tokens (release returned True for them and evict did not return them)")

    def _allocate(self) -> int | None:
        if self.free:
            block = self.free.pop(0)
        else:
            block = self._evict()
            if block is None:
                return None
        self.content[block] = None
        self.inserted.discard(block)
        return block

    def _evict(self) -> int | None:
        block = self.cache.evict()
        idle = {b for b in self.kept if self.ref[b] == 0}
        if block is None:
            self._check_nothing_evictable(idle)
            return None
        assert self.ref.get(block, 0) == 0, (
            f"evict() returned block {block}, which a running sequence still references; acquire() makes a "
            f"block unevictable until its next release()")
        assert block in idle, (
            f"evict() returned block {block}, which the cache does not keep (release never returned True for it, "
            f"or it was evicted already); evict only released cached blocks")
        self.kept.discard(block)
        self.content[block] = None
        return block

    def _check_nothing_evictable(self, idle: set[int]) -> None:
        """None is right only if every idle kept block still has a descendant in use (a radix inner node)."""
        extended = [c for b, c in self.content.items() if c is not None and (self.ref[b] or b in self.kept)]
        leaves = [b for b in idle if not any(len(c) > len(self.content[b]) and c[:len(self.content[b])]
                                              == self.content[b] for c in extended)]
        assert not leaves, f"evict() returned None while released cached blocks {sorted(leaves)} are evictable"

    @rule(data=st.data())
    def start_sequence(self, data):
        tokens = self._draw_tokens(data)
        matched = self.cache.match(tokens)
        self._check_match(tokens, matched)
        for block in matched:
            if self.ref[block] == 0:
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
        self._insert(tokens, blocks, data.draw(st.integers(len(matched), len(blocks)), "computed_blocks"))

    def _insert(self, tokens, blocks, num_computed):
        for i, block in enumerate(blocks[:num_computed]):
            self.content[block] = self._prefix(tokens, i)
            self.inserted.add(block)
        self.cache.insert(tokens[:num_computed * self.block_size], blocks[:num_computed])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def compute_rest(self, data):
        tokens, blocks = self.seqs[data.draw(st.integers(0, len(self.seqs) - 1), "sequence")]
        self._insert(tokens, blocks, len(blocks))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish_sequence(self, data):
        _, blocks = self.seqs.pop(data.draw(st.integers(0, len(self.seqs) - 1), "sequence"))
        for block in reversed(blocks):  # tail blocks first, as the BlockManager frees them
            self.ref[block] -= 1
            if self.ref[block]:
                continue
            if self.cache.release(block):
                assert block in self.inserted, (
                    f"release({block}) returned True for a block never passed to insert(); return False for "
                    f"blocks you do not cache, or the BlockManager never gets them back")
                self.kept.add(block)
            else:
                self.kept.discard(block)
                self.content[block] = None
                self.free.append(block)

    @rule()
    def evict_one(self):
        block = self._evict()
        if block is not None:
            self.free.append(block)

    @rule()
    def evict_until_none(self):
        for _ in range(self.num_blocks + 1):
            block = self._evict()
            if block is None:
                return
            self.free.append(block)
        raise AssertionError(f"evict() returned more blocks than the cache holds ({self.num_blocks})")

    @rule(data=st.data())
    def match_only(self, data):
        tokens = self._draw_tokens(data)
        self._check_match(tokens, self.cache.match(tokens))

    @invariant()
    def stats_are_numbers(self):
        stats = self.cache.stats()
        assert isinstance(stats, dict) and all(isinstance(v, (int, float)) for v in stats.values()), (
            f"stats() must return a dict of numbers, got {stats!r}")
