"""Pipeline parallelism through LLMEngine on CPU (gloo, spawned workers) against one rank: the same greedy tokens,
logprobs, temperature samples (the engine's seed), prompt logprobs and prompt logits, with chunked prefill and
several micro-batches a step."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from thread_fixtures import one_thread  # noqa: E402,F401 (autouse)
from model_fixtures import make_checkpoint  # noqa: E402
from test_moe_models import make_moe_checkpoint  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.interfaces import Constraint  # noqa: E402
from nanocore.runner import pipeline  # noqa: E402
from nanocore.runner.worker_process import WorkerError  # noqa: E402

PROMPTS = [[5, 17, 200, 3, 99, 42, 7, 150, 249], [8, 1, 77], list(range(30, 60)), [4] * 21, [100, 101], [9] * 13]
#: a 16-token step budget: the 30- and 21-token prompts prefill in chunks beside other rows' decodes
SMALL = dict(device="cpu", block_size=4, num_kv_blocks=160, max_num_batched_tokens=16)
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
TEMPERATURE = SamplingParams(temperature=0.9, top_k=20, max_tokens=6, ignore_eos=True)
SCORED = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=2)


def outputs(llm: LLM) -> dict:
    greedy = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return {
        "tokens": [o.outputs[0].token_ids for o in greedy],
        "logprobs": [o.outputs[0].cumulative_logprob for o in greedy],
        "sampled": [o.outputs[0].token_ids for o in llm.generate(PROMPTS, TEMPERATURE, use_tqdm=False)],
        "prompt": [[None if p is None else {k: v.logprob for k, v in p.items()} for p in o.prompt_logprobs]
                   for o in llm.generate(PROMPTS[:3], SCORED, use_tqdm=False)],
        "logits": llm.engine.prompt_logits(PROMPTS[2]),
    }


def test_pp2_equals_one_rank_with_chunked_prefill_and_micro_batches(tmp_path, monkeypatch):
    ckpt = make_checkpoint(tmp_path / "qwen2", "qwen2", num_hidden_layers=3, vocab_size=250)  # 2 + 1 layers
    ref = outputs(LLM(str(ckpt), **SMALL))
    cuts = []
    real = pipeline.micro_batches
    monkeypatch.setattr(pipeline, "micro_batches", lambda rows, n: cuts.append(real(rows, n)) or cuts[-1])
    llm = LLM(str(ckpt), pipeline_parallel_size=2, **SMALL)
    try:
        assert llm.engine.runner.kv_caches and len(llm.engine.runner.kv_caches) == 2  # stage 0's layers only
        got = outputs(llm)
        with pytest.raises(ValueError, match="pipeline_parallel_size > 1"):  # masks live on rank 0, not the sampler
            llm.generate([[5, 6]], SamplingParams(structured_output=Constraint("regex", "a+")))
    finally:
        llm.close()
    assert got["tokens"] == ref["tokens"]
    assert got["logprobs"] == pytest.approx(ref["logprobs"], abs=1e-4)
    assert got["sampled"] == ref["sampled"]  # the last stage samples the whole step, as one rank does
    assert len(got["prompt"]) == 3 and all(len(p) == len(q) for p, q in zip(got["prompt"], PROMPTS))
    for mine, theirs in zip(got["prompt"], ref["prompt"]):
        for a, b in zip(mine[1:], theirs[1:]):
            assert a.keys() == b.keys() and list(a.values()) == pytest.approx(list(b.values()), abs=1e-4)
    torch.testing.assert_close(got["logits"], ref["logits"], atol=1e-5, rtol=1e-5)
    chunked = [cut for cut in cuts if any(r.start > 0 and len(r.token_ids) > 1 for mb in cut for r in mb)]
    assert chunked and any(len(cut) == 2 for cut in cuts), "no step was cut into micro-batches with a prefill chunk"


def test_bad_pipeline_layouts_fail_before_starting_workers(tmp_path):
    ckpt = make_checkpoint(tmp_path / "qwen2", "qwen2", num_hidden_layers=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size 3 needs at least 3 decoder layers but .* has 2"):
        LLM(str(ckpt), pipeline_parallel_size=3, **SMALL)
    with pytest.raises(ValueError, match="with expert_parallel_size=2 is not supported"):
        LLM(str(make_moe_checkpoint(tmp_path / "moe", "qwen2_moe")), pipeline_parallel_size=2, expert_parallel_size=2,
            **SMALL)


@pytest.mark.slow
def test_tp2_by_pp2_equals_one_rank(tmp_path):
    """Four ranks: each stage a TP pair; the last stage's second rank computes logits but does not sample."""
    ckpt = make_checkpoint(tmp_path / "qwen2", "qwen2", num_hidden_layers=3, vocab_size=250)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    ref = LLM(str(ckpt), **SMALL)
    ref_out = ref.generate(PROMPTS, params, use_tqdm=False)
    ref_logits = ref.engine.prompt_logits(PROMPTS[0])
    llm = LLM(str(ckpt), tensor_parallel_size=2, pipeline_parallel_size=2, **SMALL)
    try:
        out = llm.generate(PROMPTS, params, use_tqdm=False)
        logits = llm.engine.prompt_logits(PROMPTS[0])
    finally:
        llm.close()
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref_out]
    assert [o.outputs[0].cumulative_logprob for o in out] == pytest.approx(
        [o.outputs[0].cumulative_logprob for o in ref_out], abs=1e-4)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)


def test_a_dead_last_stage_is_a_clear_error(tmp_path):
    ckpt = make_checkpoint(tmp_path / "qwen2", "qwen2", num_hidden_layers=2)
    llm = LLM(str(ckpt), pipeline_parallel_size=2, **SMALL)
    try:
        assert len(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)) == 2
        os.kill(llm.engine.executor.procs[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="rank 1 failed while running a step.*killed by signal 9"):
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        with pytest.raises(WorkerError):  # and it stays an error, never a hang
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    finally:
        llm.close()
