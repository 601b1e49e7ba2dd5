"""Where a decode step's time goes: host phases (synchronised timers around each) and pure graph replay.

    python -m benchmarks.step_profile --model dummy:Qwen3-0.6B --batch-sizes 1 256 --json OUT.json

The phase timers serialise host and GPU (run synchronously): they say which phase to work on. The
``wall_*_ms`` columns time plain decode steps without timers, synchronous and with async scheduling
(the next step's forward queued while the host post-processes), which is what throughput sees.
``--kernel-table N`` adds, per batch size and context, the N kernels with the most device time over decode steps
run eagerly (torch.profiler; decode graphs are set aside for those steps, since replays hide their kernels).
``--timeline`` traces plain decode steps as throughput runs them (graphs, async scheduling) and splits their span
into device-busy time and idle gaps: the time the GPU waits on the host (launch gaps, host work between replays).
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


def replay_ms(graphs, key: tuple[int, int], iters: int = 50) -> float:
    """Pure GPU time of one captured decode graph, keyed (bucket, context tier) (CUDA events)."""
    graph = graphs.graphs[key]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def wall_step_ms(engine, steps: int, async_scheduling: bool, sync) -> float:
    """Mean time of ``steps`` decode steps without timers (one warm-up step first, which fills the pipeline)."""
    engine.async_scheduling = async_scheduling
    engine.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    return 1e3 * (time.perf_counter() - start) / steps


def start_decoding(engine, batch_size: int, context_len: int, max_tokens: int, seed: int) -> None:
    """``batch_size`` random prompts of ``context_len`` tokens, prefilled: the next steps are pure decode."""
    from nanocore.engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = engine.loaded.hf_config.vocab_size
    params = SamplingParams(temperature=0.6, max_tokens=max_tokens, ignore_eos=True)
    for _ in range(batch_size):
        engine.add_request([rng.randrange(vocab) for _ in range(context_len)], params)
    while any(s.num_uncomputed_tokens > 1 for s in [*engine.scheduler.waiting, *engine.scheduler.running]):
        engine.step()


def profile_decode(llm, batch_size: int, context_len: int, steps: int) -> dict:
    engine, runner = llm.engine, llm.engine.runner
    start_decoding(engine, batch_size, context_len, 3 * steps + 8, seed=0)
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    async_before, engine.async_scheduling = engine.async_scheduling, False  # timers serialise anyway
    totals: dict[str, float] = defaultdict(float)
    patches = [(engine.scheduler, "schedule"), (runner, "prepare"), (runner.sampling, "tensors"),
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
    walls = {f"wall_{mode}_ms": wall_step_ms(engine, steps, mode == "async", sync) for mode in ("sync", "async")}
    engine.async_scheduling = async_before
    while engine.has_unfinished_requests():
        engine.step()
    row = {"batch_size": batch_size, "context_len": context_len, "step_ms": 1e3 * wall / steps}
    row.update({f"{k}_ms": 1e3 * v / steps for k, v in totals.items()})
    row["other_host_ms"] = row["step_ms"] - sum(1e3 * v / steps for v in totals.values())
    row.update(walls)
    if runner.decode_graphs is not None:
        # the first decode step's tier (the timed steps may reach the next); replayed on the last step's buffers
        key = runner.decode_graphs.graph_key(batch_size, context_len + 1)
        row["graph_key"] = list(key)
        row["graph_replay_gpu_ms"] = replay_ms(runner.decode_graphs, key)
    return row


def kernel_table(llm, batch_size: int, context_len: int, steps: int, top: int) -> list[dict]:
    """The ``top`` kernels by device time per decode step (eager steps under torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    start_decoding(engine, batch_size, context_len, steps + 4, seed=1)
    graphs, engine.runner.decode_graphs = engine.runner.decode_graphs, None  # eager: every kernel is visible
    try:
        engine.step()  # one decode step outside the trace (first-call work)
        on_gpu = engine.runner.device.type == "cuda"
        with profile(activities=[ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                engine.step()
            if on_gpu:
                torch.cuda.synchronize()
    finally:
        engine.runner.decode_graphs = graphs
    while engine.has_unfinished_requests():
        engine.step()

    def spent(event) -> float:  # microseconds; torch renamed cuda_time_total to device_time_total
        if not on_gpu:
            return event.self_cpu_time_total  # self time: nested ops are not counted twice
        return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
    events = sorted(prof.key_averages(), key=spent, reverse=True)
    return [{"batch_size": batch_size, "context_len": context_len, "kernel": e.key[:70],
             "us_per_step": spent(e) / steps, "calls_per_step": e.count / steps} for e in events[:top]]


def device_timeline(intervals: list[tuple[float, float]], steps: int, gap_us: float = 5.0) -> dict:
    """Busy and idle time per step of the device kernels' (start, end) intervals, in microseconds: busy is their
    union, idle the rest of their span, and ``gaps_over_*`` counts the idle stretches longer than ``gap_us``."""
    if not intervals:
        return {}
    spans = sorted(intervals)
    busy, gaps, (lo, hi) = 0.0, [], spans[0]
    for start, end in spans[1:]:
        if start > hi:
            busy, lo = busy + hi - lo, start
            gaps.append(start - hi)
        hi = max(hi, end)
    busy += hi - lo
    span = hi - spans[0][0]
    return {"span_us_per_step": span / steps, "busy_us_per_step": busy / steps,
            "idle_us_per_step": (span - busy) / steps, "largest_gap_us": max(gaps, default=0.0),
            f"gaps_over_{gap_us:g}us_per_step": sum(g > gap_us for g in gaps) / steps}


def timeline(llm, batch_size: int, context_len: int, steps: int) -> dict:
    """``device_timeline`` of ``steps`` decode steps run as throughput runs them (graphs, async scheduling)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    start_decoding(engine, batch_size, context_len, steps + 8, seed=2)
    for _ in range(2):
        engine.step()  # fills the look-ahead pipeline outside the trace
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished_requests():
        engine.step()
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return {"batch_size": batch_size, "context_len": context_len, "kernels_per_step": len(kernels) / steps,
            **device_timeline(kernels, steps)}


def main(argv=None) -> int:
    from nanocore.bench.report import environment, format_table, write_json
    from nanocore.engine.llm import LLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dummy:Qwen3-0.6B")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--context-len", type=int, nargs="+", default=[512], help="prompt length(s) before decoding")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kv-codec", default="auto", help="KV codec by name (e.g. k_int8_v_fp8)")
    parser.add_argument("--kernel-table", type=int, default=0, metavar="N", help="also list the N costliest kernels")
    parser.add_argument("--timeline", action="store_true", help="also split traced decode steps into device-busy "
                        "time and idle gaps (CUDA only)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.timeline and not args.device.startswith("cuda"):
        parser.error("--timeline traces device kernels: it needs --device cuda")
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              max_num_seqs=max(args.batch_sizes), enforce_eager=args.enforce_eager, kv_codec=args.kv_codec)
    rows = [profile_decode(llm, bs, ctx, args.steps) for ctx in args.context_len for bs in args.batch_sizes]
    print(format_table(rows))
    kernels = []
    if args.kernel_table:
        kernels = [row for ctx in args.context_len for bs in args.batch_sizes
                   for row in kernel_table(llm, bs, ctx, min(args.steps, 10), args.kernel_table)]
    if kernels:
        print(format_table(kernels))
    timelines = []
    if args.timeline:
        timelines = [timeline(llm, bs, ctx, args.steps) for ctx in args.context_len for bs in args.batch_sizes]
        print(format_table(timelines))
    write_json(args.json, {"command": "step_profile", "kv_codec": llm.engine.runner.codec.name, "rows": rows,
                           "kernels": kernels, "timelines": timelines, "environment": environment(args.device)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
