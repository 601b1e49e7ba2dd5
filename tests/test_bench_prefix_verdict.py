"""``nanocore bench prefix``: first differing position, the no-cache run's top-2 gap there, and the verdict."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import VOCAB, fake_loaded_model
from nanocore.bench.prefix import (PrefixWorkload, differences, explain_differences, run_all, run_scenario,
                                   summary_rows, top2_gap, verdict)
from nanocore.engine.llm import LLM
from nanocore.engine.outputs import Logprob
from nanocore.plugins import get_registry

SMALL = PrefixWorkload(num_requests=3, prefix_len=16, suffix_len=8, output_len=5, repeats=1)
FIELDS = {"device": "cpu", "block_size": 4, "num_kv_blocks": 256, "kv_codec": "unquantized"}


def test_top2_gap_and_differences():
    assert top2_gap({5: Logprob(-0.5, 1), 7: Logprob(-0.75, 2)}) == pytest.approx(0.25)
    assert top2_gap({5: Logprob(-0.1, 1)}) == float("inf")
    cached, base = [[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [7, 8, 0]]
    gaps = [[0.5, 0.5, 0.5], [0.3, 0.02, 0.4], [0.1, 0.2, 0.3]]
    diffs = differences(cached, base, gaps)
    assert [(d["request"], d["position"], d["no_cache_top2_gap"]) for d in diffs] == [(1, 1, 0.02), (2, 2, 0.3)]
    assert diffs[0]["cached_token"] == 5 and diffs[0]["no_cache_token"] == 9 and diffs[1]["cached_token"] is None
    assert differences(cached, base, [])[0]["no_cache_top2_gap"] is None  # no logprobs: gap unknown


def test_verdicts():
    assert verdict([], 0.05) == "identical"
    near = [{"request": 0, "position": 3, "no_cache_top2_gap": 0.01},
            {"request": 2, "position": 0, "no_cache_top2_gap": 0.03}]
    assert verdict(near, 0.05) == "identical up to near-ties (max gap 0.03)"
    assert verdict(near, 0.02) == "DIFFERENT (gap 0.03 at request 2 position 0)"
    far = near + [{"scenario": "shared-prefix", "request": 1, "position": 4, "no_cache_top2_gap": 1.5}]
    assert verdict(far, 0.05) == "DIFFERENT (gap 1.5 at shared-prefix request 1 position 4)"
    unknown = [{"request": 0, "position": 1, "no_cache_top2_gap": None}]
    assert verdict(unknown, 10.0) == "DIFFERENT (gap unknown at request 0 position 1)"


def test_run_scenario_records_top2_gaps():
    llm = LLM("fake", loaded_model=fake_loaded_model(), prefix_cache="none", **FIELDS)
    plain = run_scenario(llm, "shared-prefix", SMALL, len(VOCAB))
    with_gaps = run_scenario(llm, "shared-prefix", SMALL, len(VOCAB), logprobs=2)
    assert with_gaps.outputs == plain.outputs and plain.top2_gaps == []
    assert [len(g) for g in with_gaps.top2_gaps] == [SMALL.output_len] * SMALL.num_requests
    assert all(0 <= g < float("inf") for row in with_gaps.top2_gaps for g in row)


@pytest.mark.parametrize("cache", ["hash"])
def test_a_flipped_token_is_explained_with_the_no_cache_gap(cache):
    """A cached run whose output differs at one position: the report names that position and the no-cache
    run's top-2 gap there; the threshold decides near-tie vs DIFFERENT; ``identical`` stays strict."""
    if cache not in get_registry().names("prefix_cache"):
        pytest.skip(f"prefix cache plugin {cache!r} is not installed")
    vocab = len(VOCAB)
    cached = run_all(LLM("fake", loaded_model=fake_loaded_model(), prefix_cache=cache, **FIELDS),
                     ["shared-prefix"], SMALL, vocab)
    plain_llm = LLM("fake", loaded_model=fake_loaded_model(), prefix_cache="none", **FIELDS)
    plain = run_all(plain_llm, ["shared-prefix"], SMALL, vocab)
    assert summary_rows(cached, plain)[0]["verdict"] == "identical"
    flipped = cached["shared-prefix"].outputs[1]
    flipped[2] = (flipped[2] + 1) % vocab  # as a near-tie flip would
    gaps = explain_differences(plain_llm, cached, plain, SMALL, vocab)
    gap = gaps["shared-prefix"][1][2]
    row = summary_rows(cached, plain, gaps, near_tie_gap=gap + 1.0)[0]
    assert row["identical"] is False and row["identical_requests"] == SMALL.num_requests - 1
    assert row["differences"] == [{"scenario": "shared-prefix", "request": 1, "position": 2,
                                   "cached_token": flipped[2], "no_cache_token": plain["shared-prefix"].outputs[1][2],
                                   "no_cache_top2_gap": gap}]
    assert row["verdict"].startswith("identical up to near-ties")
    strict = summary_rows(cached, plain, gaps, near_tie_gap=gap / 2)[0]
    assert strict["verdict"].startswith("DIFFERENT") and "request 1 position 2" in strict["verdict"]
