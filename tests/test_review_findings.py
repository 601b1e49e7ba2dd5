"""Regression tests for defects found in review of the request path (each failed before its fix)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import VOCAB, fake_loaded_model  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

CPU = {"device": "cpu", "prefix_cache": "none", "scheduler_policy": "prefill_first", "kv_codec": "unquantized"}


def make_llm(num_kv_blocks=128, **loaded_kwargs):
    return LLM("fake", loaded_model=fake_loaded_model(**loaded_kwargs), block_size=4, num_kv_blocks=num_kv_blocks, **CPU)


def greedy(**kwargs):
    return SamplingParams(temperature=0, **kwargs)


def test_generate_with_one_bad_prompt_leaves_no_request_queued():
    llm = make_llm()
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["abc", "a" * 600], greedy(max_tokens=4), use_tqdm=False)
    # the good prompt added before the bad one must not stay queued (it would run, unseen, in the next call)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.requests == {}


def test_stream_without_tokenizer_leaves_no_request_queued():
    llm = make_llm(tokenizer=False)
    with pytest.raises(ValueError, match="tokenizer"):
        list(llm.stream([5, 6, 7], greedy(max_tokens=4)))
    assert not llm.engine.has_unfinished_requests()


def test_logprobs_larger_than_vocab_does_not_crash():
    llm = make_llm()
    out = llm.generate("hello", greedy(max_tokens=2, logprobs=len(VOCAB) + 10, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 2 and all(len(entry) == len(VOCAB) for entry in out.logprobs)


def test_stop_token_id_outside_vocab_is_a_clear_error():
    loaded = fake_loaded_model()
    loaded.hf_config = SimpleNamespace(vocab_size=len(VOCAB))
    llm = LLM("fake", loaded_model=loaded, block_size=4, num_kv_blocks=128, **CPU)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate("hello", greedy(max_tokens=4, min_tokens=2, stop_token_ids=[10_000]), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_prompt_logits_longer_than_max_model_len_is_a_clear_error():
    llm = make_llm(num_kv_blocks=512, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.engine.prompt_logits([5] * 100)
    assert llm.engine.block_manager.num_free_blocks == 512
