"""Explicit prefix-cache cases for the rules a cache declares (``conformance_requirements``): it keeps what it is
given (``keeps_inserted_blocks``), it holds nothing more once emptied (``forgets_evicted_blocks``), its hits stay
right when every block key collides (``block_hash``: the key function the suite may replace) and ``insert`` resumes
after the cached prefix (``incremental_insert``) and refuses a block cached for other tokens
(``rejects_reused_blocks``). Also: an acquired block outlives its evicted children, and the
toolkit's ``stats()`` counters count what happened.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from nanocore_conformance.prefix_cache_boundaries import (
    COLLISION_BLOCKS,
    EVICTION_BLOCKS,
    VOCAB,
    children_case,
    eviction_case,
)
from nanocore_conformance.prefix_cache_truth import GroundTruth, reachable_objects

#: Fill-and-empty cycles of the emptied-cache check, and the objects its state may grow by over them.
EMPTYING_CYCLES = 4
EMPTIED_SLACK = 16
#: Acquire / release cycles of one cached path while another sequence holds its blocks.
CHURN_CYCLES = 200


def random_tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(count)]


def publishing_case(truth: GroundTruth, seed: int) -> None:
    """Publishing in chunks, a block after a miss, one prefix computed by two sequences at once, the children of an
    evicted prefix reachable again once it is published anew, and an acquired block whose last child is evicted
    (a cache of at least 24 blocks). Ends with every block released and evicted."""
    bs, rng = truth.bs, random.Random(seed)
    doc = random_tokens(rng, 6 * bs)
    first = truth.admit(doc, "a new document")
    for computed in (2, 5, 6):
        truth.compute(doc, first, computed)
        truth.check(doc, f"{computed} of its 6 blocks computed, inserted in chunks as a prefill runs")
    truth.check(doc[:bs] + random_tokens(rng, bs) + doc[bs:2 * bs], "block 1 differs from the cached path and "
                "block 2 equals its block 1: a block after a miss never matches")
    twin_tokens = doc[:5 * bs] + random_tokens(rng, bs)
    twin = truth.admit(twin_tokens, "admitted before the document was published", match=False)
    truth.compute(twin_tokens, twin, 6)
    truth.check(twin_tokens, "its first 5 blocks were computed twice, by two sequences at once; its last is new")
    truth.release(first)
    evicted = truth.evict_all()
    truth.check(twin_tokens, f"after evict() returned blocks {evicted}, some maybe before the twin's last block")
    again = truth.start(doc, "the document again, after its blocks were evicted")
    truth.check(twin_tokens, "the document's prefix is published again: the twin's last block, still in use, hangs "
                "from it")
    truth.release(twin)
    truth.release(again)
    truth.evict_all()
    path = random_tokens(rng, 3 * bs)
    truth.release(truth.start(path, "a 3-block path"))
    held = truth.admit(path[:2 * bs], "its first 2 blocks matched and acquired again")
    evicted = truth.evict_all()
    truth.check(path, f"after evict() returned {evicted} while the first 2 blocks are acquired: an acquired block "
                f"is never evicted, also once its last child is")
    truth.release(held)
    truth.check_stats("after a 3-block path was released and its last block evicted")
    truth.evict_all()


class CountingTokens(Sequence):
    """Token ids that count how many of them a cache reads (by index, slice or iteration)."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.reads = tokens, 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index):
        part = self.tokens[index]
        self.reads += len(part) if isinstance(index, slice) else 1
        return part


def incremental_case(cache, seed: int) -> None:
    """A growing sequence published one block at a time, then a chunk, then again with nothing new, and a second
    sequence that shares its first blocks: each ``insert`` may read the tokens of one cached block and of the blocks
    it adds, never the whole prefix again."""
    bs, rng = cache.block_size, random.Random(seed)
    doc = random_tokens(rng, 40 * bs)
    steps = [(n, 1) for n in range(1, 31)] + [(40, 10), (40, 0)]
    branch = doc[:20 * bs] + random_tokens(rng, 4 * bs)
    steps_branch = [(n, 1) for n in range(21, 25)]
    for tokens, blocks, plan in ((doc, list(range(40)), steps), (branch, list(range(20)) + [40, 41, 42, 43],
                                                                   steps_branch)):
        for num_blocks, new in plan:
            counted = CountingTokens(tokens[:num_blocks * bs])
            cache.insert(counted, blocks[:num_blocks])
            assert counted.reads <= (1 + new) * bs, (
                f"insert of {num_blocks} blocks, of which {new} not cached yet, read {counted.reads} token ids; it "
                f"may read one cached block's and the new blocks' ({(1 + new) * bs}): resume after the cached "
                f"prefix (declare incremental_insert False if the cache walks the whole prefix)")


def reused_block_case(cache) -> None:
    """``insert`` of a block id the cache holds for other tokens (a caller's bug) raises ValueError, whether those
    tokens sort before or after the claimed ones."""
    bs = cache.block_size
    doc = random_tokens(random.Random(bs), 3 * bs)
    cache.insert(doc, [0, 1, 2])
    for step in (-1, 1):
        claimed = doc[:bs] + [(doc[bs] + step) % VOCAB] + doc[bs + 1:2 * bs]
        with pytest.raises(ValueError):
            cache.insert(claimed, [5, 1])
            pytest.fail(f"insert() accepted block 1 for tokens [{bs}, {2 * bs}) of another prefix while it holds "
                        f"block 1 for other tokens; raise ValueError saying the block is cached for other tokens")


def churn_case(truth: GroundTruth) -> int:
    """How many objects the cache's state grows by while one sequence holds its blocks and the same cached path is
    acquired and released ``CHURN_CYCLES`` times (each release makes a block evictable, each hit takes it back)."""
    rng = random.Random(7)
    held = truth.start(random_tokens(rng, 2 * truth.bs), "a sequence that holds its blocks throughout")
    path = random_tokens(rng, 3 * truth.bs)
    truth.release(truth.start(path, "a path, released"))
    before = reachable_objects(truth.cache)
    for _ in range(CHURN_CYCLES):
        truth.release(truth.start(path, "the same path acquired and released again"))
    growth = reachable_objects(truth.cache) - before
    truth.release(held)
    truth.evict_all()
    return growth


def colliding_keys(backend_cls: type, attribute: str) -> type:
    """``backend_cls`` with its declared block-key function replaced by one that gives every block the same key."""
    return type(f"{backend_cls.__name__}WithCollidingKeys", (backend_cls,),
                {attribute: staticmethod(lambda parent_key, token_ids: 0)})


class PrefixCacheRuleConformance:
    """The cases as checks of ``PrefixCacheConformance`` (which sets ``block_sizes`` and the requirements)."""

    def test_inserted_blocks_are_matched_until_evicted(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            truth = GroundTruth(backend_cls(bs, 32, backend_options), 32, self.keeps_inserted_blocks,
                                self.evicts_least_recently_released, self.counts_stats)
            publishing_case(truth, bs)
            stats = truth.cache.stats() if self.counts_stats else {}
            assert stats.get("evictable_blocks", 0) == 0 and stats.get("cached_blocks", 0) == 0, (
                f"stats() reports {stats} after evict() returned None with no block in use: nothing is cached")

    def test_an_emptied_cache_holds_nothing_more(self, backend_cls, backend_options):
        if not self.forgets_evicted_blocks:
            pytest.skip(f"{backend_cls.__name__} is not held to forgets_evicted_blocks (declared False, or it targets "
                        f"a plugin API before 1.6): it may keep state")
        bs = self.block_sizes[0]
        cache = backend_cls(bs, EVICTION_BLOCKS, backend_options)
        sizes, counts = [], None
        for cycle in range(EMPTYING_CYCLES):  # fresh tokens each cycle: state kept per prefix would pile up
            truth = GroundTruth(cache, EVICTION_BLOCKS, self.keeps_inserted_blocks,
                                self.evicts_least_recently_released, self.counts_stats)
            truth.counts = counts = counts or truth.counts  # the cache's counters run on over the cycles
            eviction_case(truth, 1000 + cycle)
            publishing_case(truth, 2000 + cycle)
            sizes.append(reachable_objects(cache))
        churn_growth = churn_case(GroundTruth(cache, EVICTION_BLOCKS, self.keeps_inserted_blocks,
                                              self.evicts_least_recently_released, self.counts_stats))
        assert churn_growth <= EMPTIED_SLACK, (
            f"while one sequence holds its blocks, acquiring and releasing the same cached path {CHURN_CYCLES} times "
            f"grows what the cache reaches by {churn_growth} objects: state of each release piles up (drop or "
            f"compact stale entries, e.g. a lazily deleted heap's, as they come)")
        assert sizes[-1] <= sizes[0] + EMPTIED_SLACK, (
            f"after each of {EMPTYING_CYCLES} cycles of filling the cache and evicting every block, it reaches "
            f"{sizes} objects: state of evicted blocks piles up (forget an evicted block's entries, also the empty "
            f"ones; declare conformance_requirements = {{'forgets_evicted_blocks': False}} only if the cache keeps "
            f"bounded history by design)")

    def test_insert_reads_only_what_it_adds(self, backend_cls, backend_options):
        if not self.incremental_insert:
            pytest.skip(f"{backend_cls.__name__} does not declare incremental_insert: insert may walk the whole prefix")
        for bs in self.block_sizes:
            incremental_case(backend_cls(bs, 64, backend_options), bs)

    def test_a_block_cached_for_other_tokens_is_refused(self, backend_cls, backend_options):
        if not self.rejects_reused_blocks:
            pytest.skip(f"{backend_cls.__name__} does not declare rejects_reused_blocks: it may ignore such blocks")
        for bs in self.block_sizes:
            reused_block_case(backend_cls(bs, 8, backend_options))

    def test_blocks_whose_keys_collide_are_told_apart(self, backend_cls, backend_options):
        if self.block_hash is None:
            pytest.skip(f"{backend_cls.__name__} declares no block_hash in conformance_requirements: no key "
                        f"function to make collide")
        weak = colliding_keys(backend_cls, self.block_hash)
        keeps, lru = self.keeps_inserted_blocks, self.evicts_least_recently_released
        for bs in self.block_sizes:
            children_case(GroundTruth(weak(bs, COLLISION_BLOCKS, backend_options), COLLISION_BLOCKS, keeps, lru,
                                      self.counts_stats))
            truth = GroundTruth(weak(bs, EVICTION_BLOCKS, backend_options), EVICTION_BLOCKS, keeps, lru,
                                self.counts_stats)
            eviction_case(truth, bs)
            publishing_case(truth, bs)
