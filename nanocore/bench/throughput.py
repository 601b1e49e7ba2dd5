"""Offline throughput, the Nano-vLLM workload: random prompts and output lengths, ignore EOS.

Prompt and output lengths are uniform in ``[min_len, max_len]`` (seed 0), prompts are random token ids,
sampling at temperature 0.6. Reports output tokens per second over the whole batch.

Warm-up (``warmup="full"``, the default): the same workload runs once untimed with every token id shifted by one,
so the timed pass sees the same batch shapes (every Triton specialisation it needs is compiled: a cold cache
otherwise puts seconds of JIT compilation into the figure; k_int8_v_fp8 on the H200 measured 12,370 output tok/s
cold and 18,587 warm) but no prefix-cache hit. ``"one"`` runs a single short request, ``"none"`` nothing.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass


@dataclass
class ThroughputResult:
    num_seqs: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    steps: int
    preemptions: int
    cached_prompt_tokens: int = 0  # prefix-cache hits in the timed pass (0 for this workload)
    warmup: str = "full"


def make_workload(num_seqs: int, min_len: int, max_len: int, vocab_size: int, seed: int = 0):
    """(prompt token ids, output length) per sequence; deterministic for a seed."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    rng = random.Random(seed)
    # Nano-vLLM's bench.py draw order (all prompts, then all output lengths; ids up to 10000), so the default
    # workload is the same 256 requests (133,966 output tokens) as the published figures.
    max_id = min(vocab_size - 1, 10000)
    prompts = [[rng.randint(0, max_id) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_seqs)]
    return list(zip(prompts, [rng.randint(min_len, max_len) for _ in range(num_seqs)]))


WARMUPS = ("full", "one", "none")


def shifted_prompts(prompts: list[list[int]], vocab_size: int) -> list[list[int]]:
    """The same lengths with every id moved by one: no block of the result matches a block of ``prompts``."""
    return [[(t + 1) % vocab_size for t in p] for p in prompts]


def run_throughput(llm, num_seqs: int, min_len: int, max_len: int, temperature: float = 0.6, seed: int = 0,
                   warmup: str | bool = "full", use_tqdm: bool = False) -> ThroughputResult:
    from nanocore.engine.sampling_params import SamplingParams

    if isinstance(warmup, bool):  # the earlier signature: True was a one-request warm-up
        warmup = "one" if warmup else "none"
    if warmup not in WARMUPS:
        raise ValueError(f"warmup must be one of {WARMUPS}, got {warmup!r}")
    vocab = llm.engine.loaded.hf_config.vocab_size
    workload = make_workload(num_seqs, min_len, max_len, vocab, seed)
    prompts = [p for p, _ in workload]
    params = [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, seed=None) for _, n in workload]
    if warmup == "full":  # same shapes, other ids: kernels compiled, prefix cache of no use to the timed pass
        llm.generate(shifted_prompts(prompts, vocab), params, use_tqdm=False)
    elif warmup == "one":  # first-call costs (allocator, lazy init) only
        llm.generate([prompts[0]], SamplingParams(temperature=temperature, max_tokens=2, ignore_eos=True),
                     use_tqdm=False)
    before = llm.stats()
    steps0, preempt0, cached0 = before.num_steps, before.num_preemptions, before.num_cached_tokens
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    seconds = time.perf_counter() - start
    stats = llm.stats()
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(p) for p in prompts)
    return ThroughputResult(num_seqs, prompt_tokens, out_tokens, seconds, out_tokens / seconds,
                            (out_tokens + prompt_tokens) / seconds, stats.num_steps - steps0,
                            stats.num_preemptions - preempt0, stats.num_cached_tokens - cached0, warmup)


def result_dict(result: ThroughputResult) -> dict:
    return asdict(result)
