"""Explicit prefix-cache cases for what random runs rarely reach: hundreds of blocks under one parent (a key that
collides must not pass for a hit: a hit compares tokens), and eviction at every depth (inner blocks whose children
stay cached) interleaved with acquire / release and with evicted blocks reused for other tokens. After every call,
``match`` returns only blocks the cache holds whose tokens and whole prefix equal the query.
"""
from __future__ import annotations

import random

#: Children of one parent block in the collision case, and KV blocks of that cache.
NUM_CHILDREN = 300
COLLISION_BLOCKS = NUM_CHILDREN + 8
VOCAB = 32000


def colliding_children(base: list[int], count: int, seed: int) -> list[tuple[int, ...]]:
    """Distinct blocks built to collide under weak keys: rotations and swaps of ``base`` (same tokens in another
    order: sum, xor or sorted keys), token pairs moved by +d / -d (same sum), then random blocks (a small table)."""
    bs, rng = len(base), random.Random(seed)
    found: dict[tuple[int, ...], None] = {}
    for r in range(1, bs):
        found[tuple(base[r:] + base[:r])] = None
    for i in range(bs - 1):
        found[tuple(base[:i] + [base[i + 1], base[i]] + base[i + 2:])] = None
    for d in range(1, 40):
        i, j = rng.sample(range(bs), 2)
        moved = list(base)
        moved[i], moved[j] = (moved[i] + d) % VOCAB, (moved[j] - d) % VOCAB
        found[tuple(moved)] = None
    while len(found) < count:
        found[tuple(rng.randrange(1, VOCAB) for _ in range(bs))] = None
    found.pop(tuple(base), None)
    return list(found)[:count]


class GroundTruth:
    """The BlockManager's side: reference counts, what each block holds, which blocks the cache keeps."""

    def __init__(self, cache, num_blocks: int):
        self.cache, self.bs = cache, cache.block_size
        self.ref = {b: 0 for b in range(num_blocks)}
        self.content: dict[int, tuple | None] = {b: None for b in range(num_blocks)}
        self.kept: set[int] = set()
        self.evicted: set[int] = set()  # evicted and not written since
        self.free = list(range(num_blocks))

    def prefix(self, tokens, i) -> tuple:
        return tuple(tokens[:(i + 1) * self.bs])

    def check(self, tokens, why: str) -> list[int]:
        hits = list(self.cache.match(tokens))
        assert len(hits) * self.bs <= len(tokens) and len(set(hits)) == len(hits), (
            f"match() of {len(tokens)} tokens returned {hits}: full blocks only, each once ({why})")
        for i, block in enumerate(hits):
            if block in self.evicted:
                raise AssertionError(f"match returned block {block} (block {i} of the query) after it was evicted "
                                     f"({why}); evict must forget the block, also an inner one whose children stay")
            held = self.content.get(block)
            assert held == self.prefix(tokens, i) and (self.ref[block] or block in self.kept), (
                f"match returned block {block} for tokens [{i * self.bs}, {(i + 1) * self.bs}) but it holds KV of "
                f"{'nothing' if held is None else 'other tokens'} ({why}); a hit must compare the block's tokens and "
                f"its whole prefix, whatever its key")
        return hits

    def allocate(self) -> int | None:
        """A free block, else one the cache evicts (None when neither)."""
        if not self.free and self.evict() is None:
            return None
        return self.free.pop(0)

    def start(self, tokens, why: str) -> list[int]:
        """A sequence of ``tokens`` (whole blocks): matched blocks acquired, the rest allocated, computed and
        inserted. Returns its blocks (fewer when KV runs out)."""
        hits = self.check(tokens, why)
        self.acquire(hits)
        blocks = list(hits)
        while len(blocks) < len(tokens) // self.bs and (block := self.allocate()) is not None:
            self.ref[block] += 1
            self.content[block] = self.prefix(tokens, len(blocks))
            self.evicted.discard(block)
            blocks.append(block)
        self.cache.insert(tokens[:len(blocks) * self.bs], blocks)
        return blocks

    def acquire(self, blocks) -> None:
        for block in blocks:
            if self.ref[block] == 0:
                self.cache.acquire(block)
            self.ref[block] += 1

    def release(self, blocks) -> None:
        for block in reversed(blocks):  # tail first, as the BlockManager frees
            self.ref[block] -= 1
            if self.ref[block] == 0:
                if self.cache.release(block):
                    self.kept.add(block)
                else:
                    self.kept.discard(block)
                    self.content[block] = None
                    self.free.append(block)

    def evict(self) -> int | None:
        block = self.cache.evict()
        if block is not None:
            assert block in self.kept and self.ref[block] == 0, (
                f"evict() returned block {block}, which is {'in use' if self.ref[block] else 'not kept'}")
            self.kept.discard(block)
            self.content[block] = None
            self.evicted.add(block)
            self.free.append(block)
        return block


def document_tree(bs: int, depth: int, seed: int) -> list[list[int]]:
    """A document of ``depth`` blocks and, for each depth d >= 1, a sibling that differs in block d (mid-block)
    and continues to ``depth`` blocks: inner blocks with several children."""
    rng = random.Random(seed)
    doc = [rng.randrange(1, VOCAB) for _ in range(depth * bs)]
    tree = [doc]
    for d in range(1, depth):
        sibling = doc[:d * bs + bs // 2] + [rng.randrange(1, VOCAB) for _ in range(depth * bs - d * bs - bs // 2)]
        tree.append(sibling)
    return tree


class PrefixCacheBoundaryConformance:
    """The cases as checks of ``PrefixCacheConformance`` (which sets ``block_sizes``)."""

    def test_hundreds_of_children_under_one_parent_are_told_apart(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            truth = GroundTruth(backend_cls(bs, COLLISION_BLOCKS, backend_options), COLLISION_BLOCKS)
            rng = random.Random(bs)
            parent, base = ([rng.randrange(1, VOCAB) for _ in range(bs)] for _ in range(2))
            truth.start(parent, "the parent block")
            children = colliding_children(base, NUM_CHILDREN, bs)
            for i, child in enumerate(children):
                truth.start(parent + list(child), f"child {i} of {NUM_CHILDREN} under one parent, before it is inserted")
            for i, child in enumerate(children):
                truth.check(parent + list(child), f"child {i} of {NUM_CHILDREN} under one parent (rotations, swaps "
                            f"and equal-sum variants of one block, then random ones), all inserted")
            truth.check(parent + base, "a block never inserted, built like its siblings")

    def test_eviction_at_every_depth_forgets_the_block(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            num_blocks, rng = 48, random.Random(bs)
            truth = GroundTruth(backend_cls(bs, num_blocks, backend_options), num_blocks)
            tree = document_tree(bs, 6, bs)
            for tokens in tree:
                truth.release(truth.start(tokens, "building a tree of inner blocks with several children"))
            held: list[int] = []
            for step in range(4 * num_blocks):
                block = truth.evict()
                if block is None:
                    break
                for i, tokens in enumerate(tree):
                    truth.check(tokens, f"path {i} of the tree, after evict() returned block {block}")
                truth.release(held)
                if step % 2:  # a sequence of other tokens takes the evicted block, then frees it
                    truth.release(truth.start([rng.randrange(1, VOCAB) for _ in range(bs)], "a reused block"))
                    held = []
                else:  # a sequence shares a path while the next eviction runs
                    held = truth.start(tree[step % len(tree)][:bs * (1 + step % 6)], "a path acquired again")
            truth.release(held)
