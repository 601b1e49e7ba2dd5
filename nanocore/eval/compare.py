"""Agreement of two backend combinations: greedy tokens and top-1 logits on a fixed prompt set.

A runs first: greedy continuations, then teacher-forced logits over prompt + A's continuation. B
generates greedily and is teacher-forced over the same token sequences, so logits compare position
by position even where the greedy outputs diverge.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In machine learning, a transformer is",
    "1, 2, 3, 5, 8, 13,",
    "The quick brown fox",
]


@dataclass
class SideResult:
    outputs: list[list[int]]  # greedy continuation per prompt
    logprobs: list[torch.Tensor]  # teacher-forced log-softmax per scored sequence [T, V], on CPU


def run_side(engine, prompts: list[list[int]], max_tokens: int, sequences: list[list[int]] | None) -> SideResult:
    """Greedy outputs of ``engine``; logprobs over ``sequences`` (default: prompt + its own outputs)."""
    from nanocore.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            finished[out.request_id] = out
    outputs = [out.outputs[0].token_ids for out in sorted(finished.values(), key=lambda o: int(o.request_id))]
    sequences = sequences or [p + o for p, o in zip(prompts, outputs)]
    # scored through the quantized cache: the comparison measures the KV codec too
    logprobs = [engine.prompt_logits(seq, kv_from_cache=True).float().log_softmax(-1).cpu()
                for seq in sequences]
    return SideResult(outputs, logprobs)


def agreement(a: SideResult, b: SideResult, prompt_lens: list[int]) -> list[dict]:
    """Per-prompt rows: greedy token agreement, first divergence, top-1 agreement, max |dlogprob|, KL(A||B)."""
    rows = []
    for i, (out_a, out_b, lp_a, lp_b) in enumerate(zip(a.outputs, b.outputs, a.logprobs, b.logprobs)):
        same = [x == y for x, y in zip(out_a, out_b)]
        diverge = same.index(False) if False in same else len(same)
        top1 = (lp_a.argmax(-1) == lp_b.argmax(-1)).float()
        kl = (lp_a.exp() * (lp_a - lp_b)).sum(-1)
        rows.append({"prompt": i, "prompt_tokens": prompt_lens[i], "greedy_agreement": sum(same) / max(len(same), 1),
                     "first_divergence": diverge, "top1_agreement": top1.mean().item(),
                     "max_abs_logprob_diff": (lp_a - lp_b).abs().max().item(), "mean_kl": kl.mean().item()})
    return rows


def summary(rows: list[dict]) -> dict:
    n = len(rows)
    return {"prompts": n,
            "greedy_agreement": sum(r["greedy_agreement"] for r in rows) / n,
            "exact_greedy_matches": sum(r["greedy_agreement"] == 1.0 for r in rows),
            "top1_agreement": sum(r["top1_agreement"] for r in rows) / n,
            "max_abs_logprob_diff": max(r["max_abs_logprob_diff"] for r in rows),
            "mean_kl": sum(r["mean_kl"] for r in rows) / n}


def prompt_token_ids(engine, prompt: str) -> list[int]:
    """Tokenized prompt; models without a tokenizer (dummy weights) get its bytes modulo the vocabulary."""
    if engine.tokenizer is not None:
        return engine.tokenize(prompt)
    vocab = engine.loaded.hf_config.vocab_size
    return [b % vocab for b in prompt.encode()]


def compare(config_a, config_b, prompts: list[str] | None = None, max_tokens: int = 32) -> dict:
    """Build A, run it, free it, build B, run it; return per-prompt rows and the summary."""
    from nanocore.engine.llm_engine import LLMEngine

    engine = LLMEngine(config_a)
    prompt_ids = [prompt_token_ids(engine, p) for p in (prompts or PROMPTS)]
    side_a = run_side(engine, prompt_ids, max_tokens, None)
    sequences = [p + o for p, o in zip(prompt_ids, side_a.outputs)]
    del engine
    gc.collect()
    engine = LLMEngine(config_b)
    side_b = run_side(engine, prompt_ids, max_tokens, sequences)
    rows = agreement(side_a, side_b, [len(p) for p in prompt_ids])
    return {"rows": rows, "summary": summary(rows)}
