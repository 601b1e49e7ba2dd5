"""Where a decode step's time goes: host phases (synchronised timers around each) and pure graph replay.

    python -m nanocore.bench.step_profile --model dummy:Qwen3-0.6B --batch-sizes 1 256 --json OUT.json

Not a throughput figure (the synchronisation serialises host and GPU); it says which phase to work on.
"""
from __future__ import annotations

import argparse
import functools
import random
import time
from collections import defaultdict

import torch


def timed(fn, name: str, totals: dict, sync):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        sync()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        totals[name] += time.perf_counter() - start
        return out
    return wrapper


def replay_ms(graphs, bs: int, iters: int = 50) -> float:
    """Pure GPU time of one captured decode graph (CUDA events)."""
    graph = graphs.graphs[bs]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def profile_decode(llm, batch_size: int, context_len: int, steps: int) -> dict:
    from nanocore.engine.sampling_params import SamplingParams

    engine, runner = llm.engine, llm.engine.runner
    rng = random.Random(0)
    vocab = engine.loaded.hf_config.vocab_size
    params = SamplingParams(temperature=0.6, max_tokens=steps + 8, ignore_eos=True)
    for _ in range(batch_size):
        engine.add_request([rng.randrange(vocab) for _ in range(context_len)], params)
    while any(s.num_uncomputed_tokens > 1 for s in [*engine.scheduler.waiting, *engine.scheduler.running]):
        engine.step()  # prefill everything first
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    totals: dict[str, float] = defaultdict(float)
    patches = [(engine.scheduler, "schedule"), (runner, "prepare"), (runner, "sampling_tensors"),
               (runner.sampler, "forward"), (runner.model, "compute_logits")]
    if runner.decode_graphs is not None:
        patches.append((runner.decode_graphs, "run"))
    else:
        patches.append((runner.model, "forward"))
    originals = [(obj, name, getattr(obj, name)) for obj, name in patches]
    for obj, name, fn in originals:
        setattr(obj, name, timed(fn, f"{type(obj).__name__}.{name}", totals, sync))
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    wall = time.perf_counter() - start
    for obj, name, fn in originals:
        setattr(obj, name, fn)
    while engine.has_unfinished_requests():
        engine.step()
    row = {"batch_size": batch_size, "context_len": context_len, "step_ms": 1e3 * wall / steps}
    row.update({f"{k}_ms": 1e3 * v / steps for k, v in totals.items()})
    row["other_host_ms"] = row["step_ms"] - sum(1e3 * v / steps for v in totals.values())
    if runner.decode_graphs is not None:
        bucket = next(b for b in runner.decode_graphs.buckets if b >= batch_size)
        row["graph_replay_gpu_ms"] = replay_ms(runner.decode_graphs, bucket)
    return row


def main(argv=None) -> int:
    from nanocore.bench.report import environment, format_table, write_json
    from nanocore.engine.llm import LLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dummy:Qwen3-0.6B")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--context-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              max_num_seqs=max(args.batch_sizes), enforce_eager=args.enforce_eager)
    rows = [profile_decode(llm, bs, args.context_len, args.steps) for bs in args.batch_sizes]
    print(format_table(rows))
    write_json(args.json, {"command": "step_profile", "rows": rows, "environment": environment(args.device)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
