"""PrefixCacheConformance: fixed scenarios for each contract rule, then a stateful run against ground truth.

The scenarios use realistic block sizes (16 and 32 tokens) and documents of many blocks; each one follows
the BlockManager's protocol (insert computed blocks while referenced, release at reference count 0,
acquire what ``match`` returned) and checks one rule deterministically. A cache may cache less than it was
given (``none`` caches nothing) but never return a block that does not hold exactly the queried prefix.
The stateful run (``prefix_cache_machine``) mixes all operations under memory pressure.
"""
from __future__ import annotations

import random
from typing import ClassVar

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from nanocore_conformance.base import MAX_EXAMPLES
from nanocore_conformance.compat import targeted_minor, warn_legacy
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.prefix_cache_boundaries import PrefixCacheBoundaryConformance
from nanocore_conformance.prefix_cache_machine import VOCAB, BlockManagerModel
from nanocore_conformance.prefix_cache_rules import PrefixCacheRuleConformance

SCENARIO_BLOCKS = 64


def document(seed: int, num_tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(num_tokens)]


def changed(tokens: list[int], position: int) -> list[int]:
    """``tokens`` with one token replaced: a sibling sharing everything before ``position``."""
    return tokens[:position] + [(tokens[position] + 1) % VOCAB] + tokens[position + 1:]


def offsets_in_block(block_size: int) -> list[int]:
    return sorted({0, 1, block_size // 2, block_size - 1})


def check_hits(cache, tokens: list[int], allowed: list[int], at_most: int, why: str) -> list[int]:
    """``match(tokens)`` returns a prefix of ``allowed`` of at most ``at_most`` blocks."""
    hits = list(cache.match(tokens))
    assert len(hits) <= at_most and hits == list(allowed[:len(hits)]), (
        f"match() returned blocks {hits}, but only a prefix of {list(allowed[:at_most])} holds these tokens' KV "
        f"({why})")
    return hits


def release_all(cache, blocks: list[int]) -> list[bool]:
    return [cache.release(b) for b in reversed(blocks)][::-1]  # tail first, as the BlockManager frees


#: The plugin API minor that added keeps_inserted_blocks, forgets_evicted_blocks and the stats() counters.
RULES_SINCE = (1, 6)


def holds_cache_rules(backend_cls, backend_entry) -> bool:
    """Whether the cache is held to plugin API 1.6's rules; one written for an older API is held to its own (hits
    must be right, but it need not keep every block, forget evicted state or count ``stats()`` as the toolkit
    names them) and told what to declare."""
    if targeted_minor(backend_cls, backend_entry) >= RULES_SINCE:
        return True
    warn_legacy(backend_cls, "written for a plugin API before 1.6, which did not require a cache to keep what "
                "insert() gives it, to forget evicted blocks or to count stats() as the toolkit names them; declare "
                "api_version = \"1.6\" once it does, with conformance_requirements {'keeps_inserted_blocks': False} / "
                "{'forgets_evicted_blocks': False} where it keeps only some blocks or a bounded history")
    return False


class PrefixCacheConformance(PrefixCacheRuleConformance, PrefixCacheBoundaryConformance, BackendContractConformance):
    kind = "prefix_cache"
    #: Block sizes of the fixed scenarios and the stateful run (the engine's default is 16).
    block_sizes: ClassVar[tuple[int, ...]] = (16, 32)
    #: Blocks of the stateful run's KV pool (small: evictions are frequent) and of one sequence there.
    num_blocks: ClassVar[int] = 14
    max_seq_blocks: ClassVar[int] = 6
    stateful_steps: ClassVar[int] = 30
    #: Every block ``insert`` publishes for a prefix no block holds is kept (``release`` True, ``match`` returns it
    #: after a matched prefix) until ``evict`` returns it. False for caches that keep only some blocks (``none``).
    keeps_inserted_blocks: ClassVar[bool] = True
    #: Once ``evict`` has returned every block, the cache reaches no more objects than when it was first emptied.
    forgets_evicted_blocks: ClassVar[bool] = True
    #: Name of the class attribute holding the block-key function ``(parent_key, token_ids) -> int``, which the
    #: suite replaces by one that makes every key collide; None: the cache has none.
    block_hash: ClassVar[str | None] = None
    #: ``insert`` reads the tokens of at most one cached block besides those of the blocks it adds.
    incremental_insert: ClassVar[bool] = False
    #: ``evict`` returns the least recently released of the idle kept blocks that no live block extends (a leaf):
    #: pure LRU (``hash``) and LRU over leaves (``radix``) both keep it.
    evicts_least_recently_released: ClassVar[bool] = False
    #: ``insert`` of a block id the cache holds for other tokens raises ValueError.
    rejects_reused_blocks: ClassVar[bool] = False
    #: ``stats()`` counters named as the toolkit's mean what it counts (a rule of plugin API 1.6, like the two above).
    counts_stats: ClassVar[bool] = True
    requirement_names = ("block_sizes", "num_blocks", "max_seq_blocks", "stateful_steps", "keeps_inserted_blocks",
                         "forgets_evicted_blocks", "block_hash", "incremental_insert", "evicts_least_recently_released",
                         "rejects_reused_blocks")

    @pytest.fixture(autouse=True)
    def _rules_of_its_api(self, backend_cls, backend_entry):
        if not holds_cache_rules(backend_cls, backend_entry):
            self.keeps_inserted_blocks = self.forgets_evicted_blocks = self.counts_stats = False

    def test_constructs(self, backend_cls, backend_options):
        cache = backend_cls(16, 8, backend_options)
        assert (cache.block_size, cache.num_blocks) == (16, 8), "call PrefixCache.__init__(block_size, num_blocks, options)"

    def test_match_stops_at_the_first_changed_token(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache, tokens = backend_cls(bs, SCENARIO_BLOCKS, backend_options), document(bs, 5 * bs + 3)
            blocks = list(range(10, 15))
            cache.insert(tokens, blocks)
            for state in ("referenced", "released"):
                check_hits(cache, tokens + document(1, 2 * bs), blocks, 5, f"{state}: a query longer than what "
                           f"was inserted matches at most the inserted blocks")
                for i in range(5):
                    check_hits(cache, tokens[:i * bs + bs - 1], blocks, i,
                               f"{state}: a partial last block never matches")
                    for offset in offsets_in_block(bs):
                        check_hits(cache, changed(tokens, i * bs + offset), blocks, i,
                                   f"{state}: token {i * bs + offset} (offset {offset} in block {i}) differs; a "
                                   f"block's key must cover all {bs} of its tokens and its whole prefix")
                if state == "referenced" and all(release_all(cache, blocks)):
                    assert check_hits(cache, tokens, blocks, 5, "kept") == blocks, (
                        "release() returned True for every block (kept), so match() must return all of them")

    def test_blocks_are_chained_to_their_whole_prefix(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache, tokens = backend_cls(bs, SCENARIO_BLOCKS, backend_options), document(bs + 1, 4 * bs)
            variants = [tokens] + [changed(tokens, i * bs + bs // 2) for i in range(3)]  # same later blocks
            tables = [[0, 1, 2, 3]]
            cache.insert(tokens, tables[0])
            for i, variant in enumerate(variants[1:]):
                shared = check_hits(cache, variant, tables[0], i, "the first tokens that differ are in block "
                                    f"{i}; the blocks after it hold the same tokens but after another prefix")
                tables.append(shared + list(range(10 * (i + 1) + len(shared), 10 * (i + 1) + 4)))
                cache.insert(variant, tables[-1])
            for variant, table in zip(variants, tables):
                check_hits(cache, variant, table, 4, "equal blocks after different prefixes are different "
                           "blocks: chain each block's key to its parent's")

    def test_siblings_are_distinct(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache, tokens = backend_cls(bs, SCENARIO_BLOCKS, backend_options), document(bs + 2, 3 * bs)
            cache.insert(tokens, [0, 1, 2])
            siblings = [changed(tokens, 2 * bs + offset) for offset in offsets_in_block(bs)]
            tables = [[0, 1, 2]]
            for i, sibling in enumerate(siblings):
                shared = check_hits(cache, sibling, [0, 1], 2, f"sibling {i} differs inside block 2")
                table = shared + list(range(10 + 3 * i + len(shared), 10 + 3 * i + 3))
                cache.insert(sibling, table)
                tables.append(table)
            for sibling, table in zip([tokens, *siblings], tables):
                check_hits(cache, sibling, table, 3, "siblings sharing their first tokens (or all but the last) "
                           "are different children")

    def test_acquired_blocks_are_never_evicted(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache = backend_cls(bs, SCENARIO_BLOCKS, backend_options)
            first, second = document(bs + 3, 4 * bs), document(bs + 4, 4 * bs)
            cache.insert(first, [0, 1, 2, 3])
            cache.insert(second, [4, 5, 6, 7])
            kept = {b for b, k in zip(range(8), release_all(cache, [0, 1, 2, 3]) + release_all(cache, [4, 5, 6, 7]))
                    if k}
            acquired = check_hits(cache, first, [0, 1, 2, 3], 4, "all released")
            for block in acquired:  # a new sequence reuses the first document's blocks
                cache.acquire(block)
            evicted = self._evict_until_none(cache, kept)
            assert not set(acquired) & set(evicted), (
                f"evict() returned blocks {sorted(set(acquired) & set(evicted))}, which match() returned and the "
                f"BlockManager then acquire()d; an acquired block must not be evicted until released again")
            assert set(evicted) == kept - set(acquired), (
                f"evict() returned None after blocks {evicted}, but released kept blocks "
                f"{sorted(kept - set(acquired) - set(evicted))} remain evictable")

    def test_blocks_in_use_are_never_evicted(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache, tokens = backend_cls(bs, SCENARIO_BLOCKS, backend_options), document(bs + 5, 4 * bs)
            cache.insert(tokens, [0, 1, 2, 3])
            block = cache.evict()
            assert block is None, (
                f"evict() returned block {block}, but every cached block is still referenced (inserted, never "
                f"released); only blocks released (and not acquired since) may be evicted")
            kept = cache.release(3)
            evicted = self._evict_until_none(cache, {3} if kept else set())
            assert evicted == ([3] if kept else []), (
                f"only block 3 was released, but evict() returned {evicted}")

    def test_evicted_blocks_are_forgotten(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache, tokens = backend_cls(bs, SCENARIO_BLOCKS, backend_options), document(bs + 6, 4 * bs)
            cache.insert(tokens, [0, 1, 2, 3])
            kept = {b for b, k in zip(range(4), release_all(cache, [0, 1, 2, 3])) if k}
            evicted = self._evict_until_none(cache, kept)
            hits = cache.match(tokens)
            assert not hits, (
                f"match() returned blocks {hits} after evict() returned blocks {evicted} and the others went "
                f"back to the free list (release returned False); evict must forget the block it returns")
            for block in range(4):  # reused for other tokens
                other = document(bs + 7 + block, bs)
                cache.insert(other, [block])
                check_hits(cache, other, [block], 1, f"block {block} now holds these tokens")
            check_hits(cache, tokens, [], 0, "every block of these tokens was evicted and now holds other tokens")

    def test_release_of_an_uncached_block_is_false(self, backend_cls, backend_options):
        for bs in self.block_sizes:
            cache, tokens = backend_cls(bs, SCENARIO_BLOCKS, backend_options), document(bs + 8, 3 * bs)
            cache.insert(tokens, [0, 1])
            for block in (5, 2):  # never inserted; allocated but not computed yet
                assert cache.release(block) is False, (
                    f"release({block}) returned True for a block never inserted; return False for blocks the "
                    f"cache does not hold (the BlockManager puts them on the free list), True only for cached ones")

    def test_stateful_against_ground_truth(self, backend_cls, backend_options):
        for block_size in self.block_sizes:
            machine = type("PrefixCacheMachine", (BlockManagerModel,), {
                "make_cache": staticmethod(lambda bs=block_size: backend_cls(bs, self.num_blocks, backend_options)),
                "block_size": block_size, "num_blocks": self.num_blocks, "max_seq_blocks": self.max_seq_blocks,
            })
            run_state_machine_as_test(machine, settings=settings(
                max_examples=MAX_EXAMPLES, stateful_step_count=self.stateful_steps, deadline=None))

    @staticmethod
    def _evict_until_none(cache, kept: set[int]) -> list[int]:
        evicted = []
        while (block := cache.evict()) is not None:
            assert block in kept and block not in evicted, (
                f"evict() returned block {block}, which the cache does not keep (released blocks it kept: "
                f"{sorted(kept)}, evicted so far: {evicted})")
            evicted.append(block)
        return evicted
