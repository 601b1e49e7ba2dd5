"""The suite itself: a correct small backend passes its checks, and each planted bug is caught."""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from nanocore.interfaces import PrefixCache
from nanocore_conformance.prefix_cache import BlockManagerModel


class DictPrefixCache(PrefixCache):
    """A correct prefix cache in a few lines: prefix tuple -> block, LRU of evictable blocks."""

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, options)
        self.block_of, self.prefix_of, self.lru = {}, {}, OrderedDict()

    def match(self, token_ids):
        blocks = []
        while (len(blocks) + 1) * self.block_size <= len(token_ids):
            block = self.block_of.get(tuple(token_ids[:(len(blocks) + 1) * self.block_size]))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def insert(self, token_ids, block_ids):
        for i, block in enumerate(block_ids):
            prefix = tuple(token_ids[:(i + 1) * self.block_size])
            if prefix not in self.block_of and block not in self.prefix_of:
                self.block_of[prefix], self.prefix_of[block] = block, prefix

    def acquire(self, block_id):
        self.lru.pop(block_id)

    def release(self, block_id):
        if block_id in self.prefix_of:
            self.lru[block_id] = None
            return True
        return False

    def evict(self):
        if not self.lru:
            return None
        block, _ = self.lru.popitem(last=False)
        del self.block_of[self.prefix_of.pop(block)]
        return block


class EvictsReferencedBlocks(DictPrefixCache):
    def acquire(self, block_id):
        pass  # bug: an acquired block stays evictable


class ForgetsNothing(DictPrefixCache):
    def evict(self):
        if not self.lru:
            return None
        return self.lru.popitem(last=False)[0]  # bug: still matched after eviction


class KeepsEverything(DictPrefixCache):
    def release(self, block_id):
        super().release(block_id)
        return True  # bug: claims to keep blocks it never cached


def run_machine(cache_cls, block_size=2, **options):
    machine = type("M", (BlockManagerModel,), {
        "make_cache": staticmethod(lambda: cache_cls(block_size, 6)), "block_size": block_size, "num_blocks": 6})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=100, stateful_step_count=40, deadline=None, database=None, **options))


def test_correct_prefix_cache_passes():
    run_machine(DictPrefixCache)


@pytest.mark.parametrize("cache_cls", [EvictsReferencedBlocks, ForgetsNothing, KeepsEverything])
def test_prefix_cache_bugs_are_caught(cache_cls):
    with pytest.raises(AssertionError):
        # derandomized: a fixed exploration that is known to reach each planted bug (random runs missed one rarely)
        run_machine(cache_cls, report_multiple_bugs=False, phases=[Phase.generate], derandomize=True)


# shrinking the planted failures would only cost time
settings.register_profile("planted_bugs", phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)


class Outcomes:
    """Collects (nodeid, outcome) of a nested pytest run."""

    def __init__(self):
        self.reports = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.reports[report.nodeid] = report.outcome


@pytest.mark.parametrize("class_name, check", [
    ("TestScaledLinear", "test_apply_matches_unquantized"),
    ("TestWritesSlotMinusOne", "test_slot_minus_one_leaves_cache_untouched"),
    ("TestCountsDroppedSlots", "test_tokens_routed_to_no_expert_contribute_nothing"),
    ("TestIgnoresTokenBudget", "test_simulated_run_keeps_invariants_and_finishes"),
])
def test_backend_bugs_are_caught(class_name, check):
    outcomes = Outcomes()
    node = f"{Path(__file__).with_name('planted_backends.py')}::{class_name}::{check}"
    profile = settings.get_current_profile_name()
    try:
        pytest.main([node, "-q", "-p", "no:cacheprovider", "--no-header",
                     "--hypothesis-profile=planted_bugs"], plugins=[outcomes])
    finally:
        settings.load_profile(profile)
    assert list(outcomes.reports.values()) == ["failed"], outcomes.reports
