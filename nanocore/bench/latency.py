"""Batch-1 latency: time to first token (TTFT) and time per output token (TPOT), greedy, ignore EOS.

The engine is driven step by step; a token's time is when the step that sampled it returns (the
sampled id is on the host then, so GPU work is finished).
"""
from __future__ import annotations

import random
import statistics
import time

from nanocore.runner.heap import frozen_heap


def one_request_timeline(engine, prompt: list[int], output_len: int) -> tuple[float, list[float]]:
    """(submit time, time of each output token) for one request running alone."""
    from nanocore.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    times: list[float] = []
    with frozen_heap():  # as LLM.generate: no full GC scan of the model's heap inside the timing
        start = time.perf_counter()
        seq = engine.add_request(prompt, params).seqs[0]
        while engine.has_unfinished_requests():
            engine.step()
            now = time.perf_counter()
            times += [now] * (seq.num_output_tokens - len(times))
    return start, times


def run_latency(llm, prompt_len: int, output_len: int, repeats: int = 3, seed: int = 0) -> dict:
    if prompt_len < 1 or output_len < 2:
        raise ValueError("latency needs --prompt-len >= 1 and --output-len >= 2 (TPOT needs two tokens)")
    engine = llm.engine
    vocab = engine.loaded.hf_config.vocab_size
    rng = random.Random(seed)
    prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
    one_request_timeline(engine, prompt, 4)  # warm-up: allocator, Triton compilation
    ttfts, tpots = [], []
    for _ in range(repeats):
        start, times = one_request_timeline(engine, prompt, output_len)
        ttfts.append(times[0] - start)
        tpots.append((times[-1] - times[0]) / (len(times) - 1))
    tpot = statistics.median(tpots)
    return {"prompt_len": prompt_len, "output_len": output_len, "repeats": repeats,
            "ttft_ms": 1e3 * statistics.median(ttfts), "tpot_ms": 1e3 * tpot, "decode_tokens_per_s": 1 / tpot,
            "tpot_ms_all": [1e3 * t for t in tpots]}
