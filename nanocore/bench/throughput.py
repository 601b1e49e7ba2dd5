"""Offline throughput: random prompts and output lengths, ignore EOS; output tokens per second over the batch.

Workloads (``WORKLOADS``, ``nanocore bench throughput --workload NAME``):

- ``nano-vllm`` (default): Nano-vLLM's bench.py, 256 sequences, prompt and output lengths uniform in
  ``[min_len, max_len]`` = 100..1024 (seed 0), the published figures' batch.
- ``kv-bound``: 512 sequences, prompts uniform 1,024..2,048 tokens, outputs uniform 512..1,024 (seed 0), run
  with ``max_num_seqs`` 512 and ``max_model_len`` 4096 unless given. At Llama-3.1-8B shapes
  (``dummy:Llama-3.1-8B``: 32 layers x 8 KV heads x 128, 128 KiB of bf16 KV per token) the batch needs about
  1.18 M tokens of KV at its end (2,304 per sequence on average), more than the ~0.85 M a bf16 cache gets on
  an H200 (141 GB, ``gpu_memory_utilization`` 0.9, 16 GB of weights): bf16 preempts and runs fewer sequences at
  once, while a one-byte codec (about half the bytes per token) holds them all. The report shows it:
  preemptions, peak running sequences and peak KV usage (fraction of the cache's blocks referenced) with the
  cache's capacity in tokens, all read from counters the scheduler and block manager keep (no per-step cost).

Prompts are random token ids, sampling at temperature 0.6.

Warm-up (``warmup="full"``, the default): the same workload runs once untimed with every token id shifted by one,
so the timed pass sees the same batch shapes (every Triton specialisation it needs is compiled: a cold cache
otherwise puts seconds of JIT compilation into the figure; k_int8_v_fp8 on the H200 measured 12,370 output tok/s
cold and 18,587 warm) but no prefix-cache hit. ``"one"`` runs a single short request, ``"none"`` nothing.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field


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
    peak_running_seqs: int = 0  # most sequences running at once in the timed pass
    peak_kv_usage: float = 0.0  # largest fraction of the KV cache's blocks referenced at once in the timed pass
    kv_capacity_tokens: int = 0  # KV-cache capacity (all sequences together)


@dataclass(frozen=True)
class Workload:
    """A named batch: sequences, prompt / output length ranges (uniform; outputs None = the prompts' range)
    and engine fields it sets unless the command line does."""

    num_seqs: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int] | None = None
    engine: dict = field(default_factory=dict)


WORKLOADS = {
    "nano-vllm": Workload(256, (100, 1024)),
    "kv-bound": Workload(512, (1024, 2048), (512, 1024), {"max_num_seqs": 512, "max_model_len": 4096}),
}


def make_workload(num_seqs: int, min_len: int, max_len: int, vocab_size: int, seed: int = 0,
                  output_lens: tuple[int, int] | None = None):
    """(prompt token ids, output length) per sequence; deterministic for a seed. Output lengths are uniform
    in ``output_lens`` (default: ``[min_len, max_len]``, as the prompts)."""
    min_out, max_out = output_lens or (min_len, max_len)
    if num_seqs < 1:
        raise ValueError(f"need at least one sequence, got num_seqs={num_seqs}")
    for what, lo, hi in (("min_len <= max_len", min_len, max_len),
                         ("min_output_len <= max_output_len", min_out, max_out)):
        if not 1 <= lo <= hi:
            raise ValueError(f"need 1 <= {what}, got {lo}, {hi}")
    rng = random.Random(seed)
    # Nano-vLLM's bench.py draw order (all prompts, then all output lengths; ids up to 10000), so the default
    # workload is the same 256 requests (133,966 output tokens) as the published figures.
    max_id = min(vocab_size - 1, 10000)
    prompts = [[rng.randint(0, max_id) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_seqs)]
    return list(zip(prompts, [rng.randint(min_out, max_out) for _ in range(num_seqs)]))


WARMUPS = ("full", "one", "none")


def shifted_prompts(prompts: list[list[int]], vocab_size: int) -> list[list[int]]:
    """The same lengths with every id moved by one: no block of the result matches a block of ``prompts``."""
    return [[(t + 1) % vocab_size for t in p] for p in prompts]


def workload_requests(vocab_size: int, num_seqs: int, min_len: int, max_len: int, temperature: float = 0.6,
                      seed: int = 0, output_lens: tuple[int, int] | None = None):
    """(prompts, sampling params) of ``make_workload``'s batch, EOS ignored: what ``run_throughput`` generates."""
    from nanocore.engine.sampling_params import SamplingParams

    workload = make_workload(num_seqs, min_len, max_len, vocab_size, seed, output_lens)
    params = [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, seed=None) for _, n in workload]
    return [p for p, _ in workload], params


def run_throughput(llm, num_seqs: int, min_len: int, max_len: int, temperature: float = 0.6, seed: int = 0,
                   warmup: str | bool = "full", use_tqdm: bool = False,
                   output_lens: tuple[int, int] | None = None) -> ThroughputResult:
    from nanocore.engine.sampling_params import SamplingParams

    if isinstance(warmup, bool):  # the earlier signature: True was a one-request warm-up
        warmup = "one" if warmup else "none"
    if warmup not in WARMUPS:
        raise ValueError(f"warmup must be one of {WARMUPS}, got {warmup!r}")
    vocab = llm.engine.loaded.hf_config.vocab_size
    prompts, params = workload_requests(vocab, num_seqs, min_len, max_len, temperature, seed, output_lens)
    if warmup == "full":  # same shapes, other ids: kernels compiled, prefix cache of no use to the timed pass
        llm.generate(shifted_prompts(prompts, vocab), params, use_tqdm=False)
    elif warmup == "one":  # first-call costs (allocator, lazy init) only
        llm.generate([prompts[0]], SamplingParams(temperature=temperature, max_tokens=2, ignore_eos=True),
                     use_tqdm=False)
    return _timed_pass(llm, prompts, params, use_tqdm, warmup)


def _timed_pass(llm, prompts, params, use_tqdm: bool, warmup: str) -> ThroughputResult:
    """Generate the batch once, timed; counters are differences over the pass, peaks restart at its start."""
    scheduler, blocks = llm.engine.scheduler, llm.engine.block_manager
    scheduler.peak_running = len(scheduler.running)
    blocks.peak_used_blocks = blocks.num_used_blocks
    before = llm.stats()
    steps0, preempt0, cached0 = before.num_steps, before.num_preemptions, before.num_cached_tokens
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    seconds = time.perf_counter() - start
    stats = llm.stats()
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(p) for p in prompts)
    return ThroughputResult(len(prompts), prompt_tokens, out_tokens, seconds, out_tokens / seconds,
                            (out_tokens + prompt_tokens) / seconds, stats.num_steps - steps0,
                            stats.num_preemptions - preempt0, stats.num_cached_tokens - cached0, warmup,
                            scheduler.peak_running, blocks.peak_used_blocks / blocks.num_blocks,
                            blocks.num_blocks * blocks.block_size)


def result_dict(result: ThroughputResult) -> dict:
    return asdict(result)
