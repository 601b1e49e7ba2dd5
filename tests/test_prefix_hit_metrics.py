"""Prefix-cache hit metrics count cached prompt tokens only: never recomputed ones, never re-admissions."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import fake_loaded_model
from nanocore.engine.llm import LLM
from nanocore.engine.sampling_params import SamplingParams
from nanocore.plugins import get_registry

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def make_llm(**fields):
    if "hash" not in get_registry().names("prefix_cache"):
        pytest.skip("prefix cache plugin 'hash' is not installed")
    fields = {"device": "cpu", "block_size": 4, "num_kv_blocks": 256, "prefix_cache": "hash",
              "scheduler_policy": "prefill_first", "kv_codec": "unquantized", **fields}
    return LLM("fake", loaded_model=fake_loaded_model(), **fields)


@pytest.mark.parametrize("prompt_len, cached", [(8, 4), (9, 8), (12, 8), (3, 0)])
def test_full_prompt_hit_counts_only_blocks_not_recomputed(prompt_len, cached):
    llm = make_llm()
    prompt = list(range(3, 3 + prompt_len))
    first = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    before = llm.stats().num_computed_tokens
    second = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    stats = llm.stats()
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == cached  # the block holding the last prompt token is recomputed
    assert stats.num_cached_tokens == cached
    assert stats.num_computed_tokens - before == prompt_len - cached + GREEDY.max_tokens - 1
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_preempted_sequences_do_not_count_their_own_kv_as_hits():
    llm = make_llm(num_kv_blocks=12, max_num_batched_tokens=6)
    prompts = [[3 + (7 * i + j) % 60 for j in range(10 + i)] for i in range(6)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    stats = llm.stats()
    assert stats.num_preemptions > 0  # recomputation found the preempted sequences' own published blocks
    assert stats.num_cached_tokens == sum(o.num_cached_tokens for o in outputs) == 0


def test_samples_of_one_request_count_their_prompt_each():
    llm = make_llm(max_num_seqs=1)  # sample 2 is admitted after sample 1 published the prompt's blocks
    prompt = list(range(3, 13))
    llm.generate([prompt], SamplingParams(n=2, temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    stats = llm.stats()
    assert stats.num_prompt_tokens == 2 * len(prompt)
    assert stats.num_cached_tokens == 8
    assert stats.num_cached_tokens <= stats.num_prompt_tokens
