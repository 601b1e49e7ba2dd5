"""Where a decode step's time goes: host phases (synchronised timers around each) and pure graph replay.

    python -m benchmarks.step_profile --model dummy:Qwen3-0.6B --batch-sizes 1 256 --json OUT.json

The phase timers serialise host and GPU (run synchronously): they say which phase to work on. The
``wall_*_ms`` columns time plain decode steps without timers, synchronous and with async scheduling
(the next step's forward queued while the host post-processes), which is what throughput sees.
``--kernel-table N`` adds, per batch size and context, the N kernels with the most device time over decode steps
run eagerly (torch.profiler; decode graphs are set aside for those steps, since replays hide their kernels).
``--out-dir DIR`` (GPU machine, ~5 min, at most ~10) runs the async-scheduling suite: the engine tests, async == sync
outputs on the model, this profile, and ``bench throughput`` with async scheduling on and off; JSON per
part in DIR.
"""
from __future__ import annotations

import argparse
import functools
import json
import random
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

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


def check_async_equals_sync(llm, num_prompts: int = 48, seed: int = 0) -> dict:
    """Same workload with async scheduling off then on (sampler re-seeded): per-request token equality.

    Mixed greedy / unseeded / seeded sampling, n = 2, scattered max_tokens, and a wide stop-id set on
    some sampled requests so rows finish at unforeseeable steps (their look-ahead token is wasted).
    """
    from nanocore.engine.sampling_params import SamplingParams

    engine = llm.engine
    rng = random.Random(seed)
    vocab = engine.loaded.hf_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(20, 200))] for _ in range(num_prompts)]
    stop_ids = rng.sample(range(vocab), vocab // 50)
    kinds = [dict(temperature=0), dict(temperature=0.8), dict(temperature=0.8, seed=7, n=2),
             dict(temperature=1.0, stop_token_ids=stop_ids)]
    params = [SamplingParams(max_tokens=rng.randint(8, 200), ignore_eos=True, **kinds[i % len(kinds)])
              for i in range(num_prompts)]
    runs = {}
    for mode in ("sync", "async"):
        engine.async_scheduling = mode == "async"
        engine.runner.sampler.generator.manual_seed(llm.config.seed)
        before = engine.stats.num_overlapped_steps
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs[mode] = ([[c.token_ids for c in o.outputs] for o in outs], time.perf_counter() - start,
                      engine.stats.num_overlapped_steps - before)
    mismatches = []
    for i, (a, b) in enumerate(zip(runs["sync"][0], runs["async"][0])):
        for j, (x, y) in enumerate(zip(a, b)):
            if x != y:
                first = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
                mismatches.append({"request": i, "sample": j, "kind": i % len(kinds), "first_diff": first,
                                   "lens": [len(x), len(y)]})
    return {"num_requests": num_prompts, "mismatches": mismatches, "identical": not mismatches,
            "seconds": {m: r[1] for m, r in runs.items()}, "overlapped_steps": {m: r[2] for m, r in runs.items()},
            "stop_finishes": sum(c.finish_reason == "stop" for r in outs for c in r.outputs)}


def run_suite(out_dir: Path, args) -> int:
    """GPU check of async scheduling; every part runs (and is reported) even when another failed."""
    from nanocore.bench.report import environment
    from nanocore.engine.llm import LLM

    out_dir.mkdir(parents=True, exist_ok=True)
    summary, failed = {}, 0

    def part(name, fn):
        nonlocal failed
        start = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # report and go on: the other parts still say something
            failed += 1
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        result = {**result, "part_seconds": time.perf_counter() - start}
        (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
        summary[name] = {k: v for k, v in result.items() if k not in ("traceback", "rows", "mismatches")}
        print(f"[{name}] {json.dumps(summary[name], default=str)[:600]}", flush=True)

    part("pytest", lambda: pytest_part(["tests/test_engine_async.py", "tests/test_gpu_engine.py"]))
    for flag in ("--no-async-scheduling", "--async-scheduling"):  # before the in-process LLM takes the GPU memory
        name = "throughput_" + ("sync" if flag.startswith("--no") else "async")
        part(name, lambda flag=flag, name=name: throughput(out_dir / f"{name}_bench.json", flag, args))
    holder = {}

    def load():
        holder["llm"] = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
                            max_num_seqs=max(256, *args.batch_sizes), prefix_cache="none", kv_codec=args.kv_codec)
        return {"model": args.model}

    part("load", load)
    part("equality", lambda: check_async_equals_sync(holder["llm"]))
    part("step_profile", lambda: {"rows": [profile_decode(holder["llm"], bs, ctx, args.steps)
                                           for ctx in args.context_len for bs in args.batch_sizes]})
    print(format_rows(out_dir / "step_profile.json"))
    (out_dir / "summary.json").write_text(json.dumps({"summary": summary, "environment": environment(args.device)},
                                                     indent=1, default=str))
    return 1 if failed else 0


def pytest_part(paths: list[str]) -> dict:
    """The engine tests (CPU ones and the cuda-marked ones) in a child process; its last lines."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
                          capture_output=True, text=True, timeout=150)
    if proc.returncode:
        raise RuntimeError(f"pytest exit {proc.returncode}: {proc.stdout[-3000:]}")
    return {"passed": True, "tail": proc.stdout.strip().splitlines()[-1]}


def throughput(path: Path, flag: str, args) -> dict:
    cmd = [sys.executable, "-m", "nanocore.cli.main", "bench", "throughput", "--model", args.model, "--device",
           args.device, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len), flag, "--json", str(path),
           "--num-seqs", str(args.throughput_num_seqs), "--kv-codec", args.kv_codec]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # two passes: full warm-up
    if proc.returncode:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    result = json.loads(path.read_text())["result"]
    return {k: result[k] for k in ("output_tokens_per_s", "total_tokens_per_s", "seconds") if k in result}


def format_rows(path: Path) -> str:
    from nanocore.bench.report import format_table
    rows = json.loads(path.read_text()).get("rows") if path.exists() else None
    return format_table(rows) if rows else "(no step profile rows)"


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
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--out-dir", metavar="DIR", help="run the async-scheduling GPU suite, JSON files in DIR")
    parser.add_argument("--throughput-num-seqs", type=int, default=256, help="sequences of the suite's bench throughput")
    args = parser.parse_args(argv)
    if args.out_dir:
        return run_suite(Path(args.out_dir), args)
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
    write_json(args.json, {"command": "step_profile", "kv_codec": llm.engine.runner.codec.name, "rows": rows,
                           "kernels": kernels, "environment": environment(args.device)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
