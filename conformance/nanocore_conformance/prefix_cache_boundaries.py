"""Explicit prefix-cache cases for what random runs rarely reach: hundreds of blocks under one parent (a key that
collides must not pass for a hit: a hit compares tokens), and eviction at every depth (inner blocks whose children
stay cached) interleaved with acquire / release and with evicted blocks reused for other tokens. After every call,
``match`` returns only blocks the cache holds whose tokens and whole prefix equal the query.
"""
from __future__ import annotations

import random

from nanocore_conformance.prefix_cache_truth import GroundTruth

#: Children of one parent block in the collision case, and KV blocks of that cache.
NUM_CHILDREN = 300
COLLISION_BLOCKS = NUM_CHILDREN + 8
#: KV blocks of the eviction case.
EVICTION_BLOCKS = 48
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


def children_case(truth: GroundTruth) -> None:
    """``NUM_CHILDREN`` children of one parent block (a cache of ``COLLISION_BLOCKS``), each checked before and
    after it is inserted."""
    bs = truth.bs
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


def eviction_case(truth: GroundTruth, seed: int) -> None:
    """A tree of inner blocks with several children (a cache of ``EVICTION_BLOCKS``), evicted one block at a time
    until none is left, while paths are acquired again and evicted blocks are reused for other tokens; every path is
    checked after each eviction. Ends with every block released."""
    bs, rng = truth.bs, random.Random(seed)
    tree = document_tree(bs, 6, seed)
    for tokens in tree:
        truth.release(truth.start(tokens, "building a tree of inner blocks with several children"))
    held: list[int] = []
    for step in range(4 * EVICTION_BLOCKS):
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


class PrefixCacheBoundaryConformance:
    """The cases as checks of ``PrefixCacheConformance`` (which sets ``block_sizes`` and
    ``keeps_inserted_blocks``)."""

    def test_hundreds_of_children_under_one_parent_are_told_apart(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache = backend_cls(bs, COLLISION_BLOCKS, backend_options)
            children_case(GroundTruth(cache, COLLISION_BLOCKS, self.keeps_inserted_blocks,
                                self.evicts_least_recently_released, self.counts_stats))

    def test_eviction_at_every_depth_forgets_the_block(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            truth = GroundTruth(backend_cls(bs, EVICTION_BLOCKS, backend_options), EVICTION_BLOCKS,
                                self.keeps_inserted_blocks,
                                self.evicts_least_recently_released, self.counts_stats)
            eviction_case(truth, bs)
            truth.check_stats("after a tree was evicted block by block")
