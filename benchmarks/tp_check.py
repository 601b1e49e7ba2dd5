"""Multi-GPU check: TP=N / EP=N / TP=N+EP=N logits vs one rank on small random checkpoints, then bench scaling.

Usage (a GPU machine, repository root)::

    python -m benchmarks.tp_check --gpus 2 --json tp_check_2gpu.json
    python -m benchmarks.tp_check --gpus 4 --bench --bench-model dummy:Qwen2.5-7B \\
        --moe-bench-model dummy:Qwen1.5-MoE-A2.7B --json tp_check_4gpu.json
    python -m benchmarks.tp_check --gpus 2 --device cpu --no-moe   # dry run on gloo (slow, tiny)

Part 1 writes a random dense (Qwen2, GQA, odd vocab) and a random MoE (Qwen2-MoE, shared expert)
checkpoint, computes teacher-forced logits and greedy tokens at one rank, then at each parallel layout,
and reports max |diff|, top-1 agreement, greedy agreement and the KV block count every rank agreed on
(the minimum). With ``--backends`` the same comparison runs with plugins chosen by name (fp8_w8a16 on a
quantized copy of the dense checkpoint, k_int8_v_fp8 KV, radix prefix cache, decode_first scheduler; the MoE
executor is ``auto``'s, triton_fused_moe on CUDA): both sides use the backends, and every rank reports the
backends its forward runs, so a worker that loaded a different backend fails the row. Part 2 (``--bench``)
runs ``nanocore bench throughput`` and ``bench latency`` at TP=1 and TP=N (MoE: EP=1, TP=N, EP=N,
TP=N+EP=N), each in a fresh process, and prints the scaling.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from nanocore.runner.worker_process import NVLS_OFF  # the engine's own: one definition

PROMPTS = [[(17 * i + 5) % 997 for i in range(n)] for n in (7, 64, 200)]
#: fp32 on GPU differs only by reduction order; bf16 by rounding of partial sums
TOLERANCE = {"float32": 2e-3, "bfloat16": 0.25, "float16": 0.1}


def make_checkpoints(root: Path, moe: bool) -> dict[str, Path]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2MoeConfig

    shapes = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                  vocab_size=1003, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False)
    configs = {"dense": Qwen2Config(**shapes, intermediate_size=1408, architectures=["Qwen2ForCausalLM"])}
    if moe:
        configs["moe"] = Qwen2MoeConfig(**shapes, intermediate_size=1408, moe_intermediate_size=256, num_experts=8,
                                        num_experts_per_tok=2, shared_expert_intermediate_size=512,
                                        architectures=["Qwen2MoeForCausalLM"])
    paths = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for pname, param in model.named_parameters():
                if pname.endswith("mlp.gate.weight"):
                    param.normal_(0.0, 0.5)  # decisive routing: top-k ties would make EP look wrong
                elif not pname.endswith("norm.weight"):
                    param.normal_(0.0, 0.05)
        paths[name] = root / name
        model.save_pretrained(paths[name])
    return paths


def layouts(gpus: int, kind: str) -> list[tuple[int, int]]:
    """(tensor_parallel_size, expert_parallel_size) pairs compared against (1, 1)."""
    return [(gpus, 1)] if kind == "dense" else [(gpus, 1), (1, gpus), (gpus, gpus)]


def measure(model: Path, tp: int, ep: int, args, dtype: str | None = None, **backends) -> dict:
    """Logits of PROMPTS[0..], greedy tokens and the KV block count of one engine; the engine is closed after."""
    import torch

    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams
    from nanocore.runner.worker_process import backend_names

    llm = LLM(str(model), device=args.device, dtype=dtype or args.dtype, tensor_parallel_size=tp,
              expert_parallel_size=ep, gpu_memory_utilization=args.gpu_memory_utilization, cpu_kv_cache_gib=0.25,
              enforce_eager=args.eager, max_num_seqs=8, **backends)  # 3 prompts: few graphs to capture
    try:
        logits = torch.cat([llm.engine.prompt_logits(p).float().cpu() for p in PROMPTS])
        greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
        tokens_again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
        executor = llm.engine.executor
        blocks = [llm.engine.runner.num_blocks] + getattr(executor, "worker_num_blocks", [])
        ranks = [backend_names(llm.engine.loaded, llm.engine.runner.codec)]
        ranks += getattr(executor, "worker_backends", [])
        return {"logits": logits, "tokens": tokens, "kv_blocks_per_rank": blocks, "backends_per_rank": ranks,
                "repeat_identical": tokens_again == tokens,  # the second pass reads the prefix cache, if any
                "backends": {kind: llm.config.model_dump()[kind] for kind in backends},
                "cached_tokens": llm.stats().num_cached_tokens}
    finally:
        llm.close()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def compare(ref: dict, got: dict, dtype: str, quantized: bool = False) -> dict:
    """Pass: every rank has the same KV block count and backends, a repeated greedy run repeats, and the
    logits match (fp32: max |diff| within tolerance and >= 90% of the greedy tokens equal, so a broken decode
    or CUDA-graph path fails; ``quantized`` or half precision: top-1 agreement >= 0.99 may stand in for the
    diff, since int8 / fp8 / bf16 rounding turns reduction-order noise into whole steps)."""
    diff = (ref["logits"] - got["logits"]).abs().max().item()
    top1 = (ref["logits"].argmax(-1) == got["logits"].argmax(-1)).float().mean().item()
    same = sum(a == b for r, g in zip(ref["tokens"], got["tokens"]) for a, b in zip(r, g))
    greedy = same / sum(len(r) for r in ref["tokens"])
    blocks, ranks = got["kv_blocks_per_rank"], got.get("backends_per_rank", [{}])
    consistent = len(set(blocks)) == 1 and all(b == ranks[0] for b in ranks) and got.get("repeat_identical", True)
    close = diff <= TOLERANCE[dtype] or ((quantized or dtype != "float32") and top1 >= 0.99)
    return {"max_abs_logit_diff": diff, "top1_agreement": top1, "greedy_token_agreement": greedy,
            "kv_blocks_per_rank": blocks, "kv_blocks_agree": len(set(blocks)) == 1, "backends_per_rank": ranks,
            "repeat_identical": got.get("repeat_identical", True),
            "ok": consistent and close and (dtype != "float32" or greedy >= 0.9)}


def check_logits(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, path in make_checkpoints(Path(tmp), moe=not args.no_moe).items():
            ref = measure(path, 1, 1, args)
            for tp, ep in layouts(args.gpus, kind):
                got = measure(path, tp, ep, args)
                row = {"model": kind, "tp": tp, "ep": ep, **compare(ref, got, args.dtype)}
                rows.append(row)
                executor = got["backends_per_rank"][0]["moe_executor"] or ""
                print(f"{kind:6} TP={tp} EP={ep} {executor}: max|diff| {row['max_abs_logit_diff']:.2e}  "
                      f"top-1 {row['top1_agreement']:.4f}  greedy {row['greedy_token_agreement']:.4f}  KV blocks "
                      f"{row['kv_blocks_per_rank']}  {'ok' if row['ok'] else 'MISMATCH'}", flush=True)
    return rows


def dense_backends() -> dict:
    return dict(linear_method="fp8_w8a16", kv_codec="k_int8_v_fp8", prefix_cache="radix",
                scheduler_policy="decode_first")


def check_backends(args) -> list[dict]:
    """Plugins chosen by name at TP=N vs the same plugins at one rank; each rank reports the backends its
    forward runs (workers load plugins themselves) and the repeated greedy run must read the prefix cache.
    The MoE executor plugin is the logits check's (``auto`` picks triton_fused_moe on CUDA)."""
    from nanocore.cli.main import main as nanocore_main

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dense = make_checkpoints(Path(tmp), moe=False)["dense"]
        fp8 = Path(tmp) / "dense_fp8"
        if nanocore_main(["quantize", "--method", "fp8_w8a16", "--model", str(dense), "--out", str(fp8)]):
            raise RuntimeError("nanocore quantize failed")
        backends = dense_backends()
        ref = measure(fp8, 1, 1, args, dtype=args.backends_dtype, **backends)
        for tp, ep in layouts(args.gpus, "dense"):
            got = measure(fp8, tp, ep, args, dtype=args.backends_dtype, **backends)
            row = {"model": "dense_fp8", "tp": tp, "ep": ep, "backends": got["backends"],
                   "cached_tokens": got["cached_tokens"], **compare(ref, got, args.backends_dtype, quantized=True)}
            row["ok"] = row["ok"] and row["cached_tokens"] > 0
            rows.append(row)
            print(f"dense_fp8 TP={tp} EP={ep} {row['backends_per_rank']}: max|diff| {row['max_abs_logit_diff']:.2e}  "
                  f"top-1 {row['top1_agreement']:.4f}  greedy {row['greedy_token_agreement']:.4f}  cached "
                  f"tokens {row['cached_tokens']}  {'ok' if row['ok'] else 'MISMATCH'}", flush=True)
    return rows


def bench(args, rows: list[dict], save) -> None:
    """``nanocore bench throughput|latency`` per layout, each in its own process (GPU memory starts clean);
    ``save()`` after each run, so a call cut short keeps what finished."""
    both = ("throughput", "latency")
    runs = [(args.bench_model, 1, 1, "", both), (args.bench_model, args.gpus, 1, "", both)] if args.bench_model else []
    if args.moe_bench_model:
        moe_layouts = ([tuple(int(x) for x in pair.split(",")) for pair in args.moe_layouts.split()]
                       if args.moe_layouts else [(1, 1)] + layouts(args.gpus, "moe"))
        runs += [(args.moe_bench_model, tp, ep, args.moe_bench_args, args.moe_modes.split(","))
                 for tp, ep in moe_layouts]
    modes = {"throughput": args.throughput_args, "latency": args.latency_args}
    with tempfile.TemporaryDirectory() as tmp:
        for model, tp, ep, model_args, run_modes in runs:
            for mode, extra in ((m, modes[m]) for m in run_modes):
                out = Path(tmp) / f"{mode}_{tp}_{ep}.json"
                cmd = [sys.executable, "-m", "nanocore.cli.main", "bench", mode, "--model", model, "--device",
                       args.device, "--tensor-parallel-size", str(tp), "--expert-parallel-size", str(ep),
                       "--json", str(out), *extra.split(), *model_args.split()]
                print("$", " ".join(cmd), flush=True)
                returncode = run_process_group(cmd, args.bench_timeout_s)
                # a run whose JSON exists measured; a non-zero code then is its teardown's (kept alongside)
                result = json.loads(out.read_text())["result"] if out.exists() else None
                rows.append({"mode": mode, "model": model, "tp": tp, "ep": ep, "result": result,
                             "returncode": returncode})
                save()
    _print_scaling(rows, args.gpus)


def run_process_group(cmd: list[str], timeout_s: float) -> int | str:
    """Run ``cmd`` in its own process group; on timeout, or when this script is stopped, kill the whole group
    (its spawned ranks too, which would otherwise keep their GPUs' memory and fail every later run)."""
    proc = subprocess.Popen(cmd, env={**os.environ, **NVLS_OFF}, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left (nothing, after a clean exit)
        proc.wait()


def _print_scaling(rows: list[dict], gpus: int) -> None:
    """Each run against one GPU (TP=1 EP=1), or against TP-only where that was not run."""
    metric = {"throughput": "output_tokens_per_s", "latency": "tpot_ms"}
    base = {(r["mode"], r["model"]): r for r in rows if (r["tp"], r["ep"]) == (gpus, 1)}
    base.update({(r["mode"], r["model"]): r for r in rows if (r["tp"], r["ep"]) == (1, 1)})
    for r in rows:
        b = base.get((r["mode"], r["model"]))
        if r["result"] is None or b is None or b["result"] is None:
            print(f"{r['mode']:10} {r['model']} TP={r['tp']} EP={r['ep']}: failed (exit {r['returncode']})")
            continue
        value, ref = r["result"][metric[r["mode"]]], b["result"][metric[r["mode"]]]
        exit_note = "" if r["returncode"] == 0 else f"  [exit {r['returncode']} after writing its result]"
        print(f"{r['mode']:10} {r['model']} TP={r['tp']} EP={r['ep']}: {metric[r['mode']]} {value:.2f} "
              f"({value / ref:.2f}x of TP={b['tp']} EP={b['ep']}){exit_note}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, required=True, help="ranks per engine (GPUs, or processes with --device cpu)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu for a gloo dry run")
    p.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE), help="dtype of the logits check")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs in the logits check")
    p.add_argument("--no-moe", action="store_true", help="skip the MoE checkpoint (EP layouts)")
    p.add_argument("--backends", action="store_true", help="also check plugins chosen by name at TP=N / EP=N")
    p.add_argument("--backends-dtype", default="float32", choices=sorted(TOLERANCE),
                   help="dtype of the backends check (bf16 noise flips top-1 of random models, MoE routing most)")
    p.add_argument("--bench", action="store_true", help="also run bench throughput / latency at TP=1 and TP=N")
    p.add_argument("--skip-logits", action="store_true", help="skip part 1's plain logits check")
    p.add_argument("--bench-model", default="dummy:Qwen2.5-7B", help="dense model of the TP scaling ('' to skip)")
    p.add_argument("--moe-bench-model", default=None, help="e.g. dummy:Qwen1.5-MoE-A2.7B (EP / TP+EP scaling)")
    p.add_argument("--moe-bench-args", default="--moe-executor triton_fused_moe --max-model-len 2048",
                   help="extra flags for the MoE model's bench runs")
    p.add_argument("--moe-layouts", default="", help="'TP,EP' pairs for the MoE bench (default: 1,1 and every layout)")
    p.add_argument("--moe-modes", default="throughput,latency", help="bench modes of the MoE model")
    p.add_argument("--bench-timeout-s", type=float, default=180, help="limit per bench process")
    p.add_argument("--throughput-args", default="--num-seqs 256", help="extra flags for bench throughput")
    p.add_argument("--latency-args", default="--prompt-len 128 --output-len 128", help="extra flags for bench latency")
    p.add_argument("--json", metavar="PATH", help="write every row as JSON")
    args = p.parse_args(argv)
    os.environ.update(NVLS_OFF)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` stops us: finally-blocks kill bench runs
    if args.device.startswith("cuda"):
        import torch
        if torch.cuda.device_count() < args.gpus:
            p.error(f"--gpus {args.gpus} but {torch.cuda.device_count()} CUDA devices are visible")
    from nanocore.bench.report import environment

    report = {"gpus": args.gpus, "device": args.device, "dtype": args.dtype, "environment": environment(args.device),
              "logits": [] if args.skip_logits else check_logits(args)}

    def save() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2))

    save()
    if args.backends:
        report["backends"] = check_backends(args)
        save()
    if args.bench:
        report["bench"] = []
        bench(args, report["bench"], save)
    bench_ok = all(r["result"] is not None and r["returncode"] == 0 for r in report.get("bench", []))
    return 0 if bench_ok and all(r["ok"] for r in report["logits"] + report.get("backends", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
