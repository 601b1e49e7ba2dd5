"""Host-side cost of one decode step, measured on CPU with the model stubbed out.

    OMP_NUM_THREADS=1 python -m benchmarks.host_overhead --num-seqs 256 --steps 50 [--profile]

``model.forward`` returns zeros and ``compute_logits`` a fixed random slice, so what is timed is the
engine's Python: scheduling, input preparation, sampling parameters, the sampler's bookkeeping on small
logits, and post-processing. It tells whether a change to the host path helps; not a GPU figure.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time

import torch


def build_llm(num_seqs: int, max_model_len: int, num_kv_blocks: int, logits_width: int,
              async_scheduling: bool = False):
    """An LLM on the ``dummy:tiny-qwen2`` preset (CPU) whose forward and logits are cheap stubs.

    Synchronous by default: on CPU nothing overlaps, and every decode step then goes through ``prepare``.

    The logits stub is ``logits_width`` columns wide (sampled ids stay valid token ids): the sampler's
    per-element math is device work on a GPU, so on CPU it is kept small to leave the host cost visible.
    """
    from nanocore.engine.llm import LLM

    llm = LLM("dummy:tiny-qwen2", device="cpu", dtype="float32", max_model_len=max_model_len,
              max_num_seqs=num_seqs, num_kv_blocks=num_kv_blocks, enforce_eager=True,
              async_scheduling=async_scheduling)
    model = llm.engine.runner.model
    hidden_size = llm.engine.loaded.hf_config.hidden_size
    width = min(logits_width, llm.engine.loaded.hf_config.vocab_size)
    logits = torch.randn(num_seqs * 2, width, generator=torch.Generator().manual_seed(0))
    model.forward = lambda input_ids, positions, meta: torch.zeros(input_ids.shape[0], hidden_size)
    model.compute_logits = lambda hidden: logits[:hidden.shape[0]]  # fixed rows: the sampler still samples
    return llm


def add_requests(llm, num_seqs: int, prompt_len: int, max_tokens: int, seed: int = 0) -> None:
    from nanocore.engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = llm.engine.loaded.hf_config.vocab_size
    params = SamplingParams(temperature=0.6, max_tokens=max_tokens, ignore_eos=True)
    for _ in range(num_seqs):
        llm.engine.add_request([rng.randrange(vocab) for _ in range(prompt_len)], params)


def prefill(engine) -> None:
    """Step until every sequence is running and decoding one token per step."""
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed_tokens > 1 for s in sched.running):
        engine.step()


def time_decode(llm, args, profiler: cProfile.Profile | None = None) -> float:
    """Fresh requests, prefill, then ``args.steps`` timed decode steps; returns ms per step."""
    engine = llm.engine
    add_requests(llm, args.num_seqs, args.prompt_len, args.max_tokens)
    prefill(engine)
    if profiler is not None:
        profiler.enable()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    elapsed = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    return 1e3 * elapsed / args.steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--logits-width", type=int, default=4, help="columns of the stub logits (<= vocab)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="time the look-ahead decode path (its host work; nothing overlaps on CPU)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile top list of the decode steps")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if args.steps >= args.max_tokens:
        parser.error("--steps must be below --max-tokens so every timed step decodes all sequences")
    torch.set_num_threads(1)
    max_model_len = args.prompt_len + args.max_tokens
    blocks_per_seq = -(-max_model_len // 16)  # the default block_size
    llm = build_llm(args.num_seqs, max_model_len, args.num_seqs * blocks_per_seq + 16,
                    args.logits_width, args.async_scheduling)
    runs = [time_decode(llm, args) for _ in range(args.repeats)]
    print(f"host_ms_per_decode_step={statistics.median(runs):.3f} min={min(runs):.3f} "
          f"(num_seqs={args.num_seqs}, steps={args.steps}, async={args.async_scheduling}, runs={', '.join(f'{r:.3f}' for r in runs)})")
    if args.profile:
        profiler = cProfile.Profile()
        time_decode(llm, args, profiler)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
