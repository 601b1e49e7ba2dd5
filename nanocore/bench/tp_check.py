"""Multi-GPU check: TP=N / EP=N / TP=N+EP=N logits vs one rank on small random checkpoints, then bench scaling.

Usage (the GPU machine, repo root, after ``source nanocore/bench/gpu_setup.sh``)::

    python -m nanocore.bench.tp_check --gpus 2 --json docs/data/tp_check_2gpu.json
    python -m nanocore.bench.tp_check --gpus 4 --bench --bench-model dummy:Qwen2.5-7B \\
        --moe-bench-model dummy:Qwen1.5-MoE-A2.7B --json docs/data/tp_check_4gpu.json
    python -m nanocore.bench.tp_check --gpus 2 --device cpu --no-moe   # dry run on gloo (slow, tiny)

Part 1 writes a random dense (Qwen2, GQA, odd vocab) and a random MoE (Qwen2-MoE, shared expert)
checkpoint, computes teacher-forced logits and greedy tokens at one rank, then at each parallel layout,
and reports max |diff|, top-1 agreement, greedy agreement and the KV block count every rank agreed on
(the minimum). Part 2 (``--bench``) runs ``nanocore bench throughput`` and ``bench latency`` at TP=1 and
TP=N (MoE: EP=1, TP=N, EP=N, TP=N+EP=N), each in a fresh process, and prints the scaling.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
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


def measure(model: Path, tp: int, ep: int, args) -> dict:
    """Logits of PROMPTS[0..], greedy tokens and the KV block count of one engine; the engine is closed after."""
    import torch

    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams

    llm = LLM(str(model), device=args.device, dtype=args.dtype, tensor_parallel_size=tp, expert_parallel_size=ep,
              gpu_memory_utilization=args.gpu_memory_utilization, cpu_kv_cache_gib=0.25, enforce_eager=args.eager)
    try:
        logits = torch.cat([llm.engine.prompt_logits(p).float().cpu() for p in PROMPTS])
        greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
        workers = llm.engine.workers
        blocks = [llm.engine.runner.num_blocks] + (workers.worker_num_blocks if workers else [])
        return {"logits": logits, "tokens": tokens, "kv_blocks_per_rank": blocks}
    finally:
        llm.close()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def compare(ref: dict, got: dict, dtype: str) -> dict:
    diff = (ref["logits"] - got["logits"]).abs().max().item()
    top1 = (ref["logits"].argmax(-1) == got["logits"].argmax(-1)).float().mean().item()
    same = sum(a == b for r, g in zip(ref["tokens"], got["tokens"]) for a, b in zip(r, g))
    total = sum(len(r) for r in ref["tokens"])
    blocks = got["kv_blocks_per_rank"]
    return {"max_abs_logit_diff": diff, "top1_agreement": top1, "greedy_token_agreement": same / total,
            "kv_blocks_per_rank": blocks, "kv_blocks_agree": len(set(blocks)) == 1,
            "ok": len(set(blocks)) == 1 and (diff <= TOLERANCE[dtype] or (dtype != "float32" and top1 >= 0.99))}


def check_logits(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, path in make_checkpoints(Path(tmp), moe=not args.no_moe).items():
            ref = measure(path, 1, 1, args)
            for tp, ep in layouts(args.gpus, kind):
                row = {"model": kind, "tp": tp, "ep": ep, **compare(ref, measure(path, tp, ep, args), args.dtype)}
                rows.append(row)
                print(f"{kind:6} TP={tp} EP={ep}: max|diff| {row['max_abs_logit_diff']:.2e}  top-1 "
                      f"{row['top1_agreement']:.4f}  greedy {row['greedy_token_agreement']:.4f}  KV blocks "
                      f"{row['kv_blocks_per_rank']}  {'ok' if row['ok'] else 'MISMATCH'}", flush=True)
    return rows


def bench(args) -> list[dict]:
    """``nanocore bench throughput|latency`` per layout, each in its own process (GPU memory starts clean)."""
    runs = [(args.bench_model, 1, 1), (args.bench_model, args.gpus, 1)]
    if args.moe_bench_model:
        runs += [(args.moe_bench_model, tp, ep) for tp, ep in [(1, 1)] + layouts(args.gpus, "moe")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, tp, ep in runs:
            for mode, extra in (("throughput", args.throughput_args), ("latency", args.latency_args)):
                out = Path(tmp) / f"{mode}_{tp}_{ep}.json"
                cmd = [sys.executable, "-m", "nanocore.cli.main", "bench", mode, "--model", model, "--device",
                       args.device, "--tensor-parallel-size", str(tp), "--expert-parallel-size", str(ep),
                       "--json", str(out), *extra.split()]
                print("$", " ".join(cmd), flush=True)
                done = subprocess.run(cmd, env={**os.environ, **NVLS_OFF})
                result = json.loads(out.read_text())["result"] if done.returncode == 0 and out.exists() else None
                rows.append({"mode": mode, "model": model, "tp": tp, "ep": ep, "result": result,
                             "returncode": done.returncode})
    _print_scaling(rows)
    return rows


def _print_scaling(rows: list[dict]) -> None:
    metric = {"throughput": "output_tokens_per_s", "latency": "tpot_ms"}
    base = {(r["mode"], r["model"]): r for r in rows if r["tp"] == 1 and r["ep"] == 1}
    for r in rows:
        b = base.get((r["mode"], r["model"]))
        if r["result"] is None or b is None or b["result"] is None:
            print(f"{r['mode']:10} {r['model']} TP={r['tp']} EP={r['ep']}: failed (exit {r['returncode']})")
            continue
        value, ref = r["result"][metric[r["mode"]]], b["result"][metric[r["mode"]]]
        print(f"{r['mode']:10} {r['model']} TP={r['tp']} EP={r['ep']}: {metric[r['mode']]} {value:.2f} "
              f"({value / ref:.2f}x of TP=1)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, required=True, help="ranks per engine (GPUs, or processes with --device cpu)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu for a gloo dry run")
    p.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE), help="dtype of the logits check")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs in the logits check")
    p.add_argument("--no-moe", action="store_true", help="skip the MoE checkpoint (EP layouts)")
    p.add_argument("--bench", action="store_true", help="also run bench throughput / latency at TP=1 and TP=N")
    p.add_argument("--bench-model", default="dummy:Qwen2.5-7B")
    p.add_argument("--moe-bench-model", default=None, help="e.g. dummy:Qwen1.5-MoE-A2.7B (EP / TP+EP scaling)")
    p.add_argument("--throughput-args", default="--num-seqs 256", help="extra flags for bench throughput")
    p.add_argument("--latency-args", default="--prompt-len 128 --output-len 128", help="extra flags for bench latency")
    p.add_argument("--json", metavar="PATH", help="write every row as JSON")
    args = p.parse_args(argv)
    os.environ.update(NVLS_OFF)
    if args.device.startswith("cuda"):
        import torch
        if torch.cuda.device_count() < args.gpus:
            p.error(f"--gpus {args.gpus} but {torch.cuda.device_count()} CUDA devices are visible")
    report = {"gpus": args.gpus, "device": args.device, "dtype": args.dtype, "logits": check_logits(args)}
    if args.bench:
        report["bench"] = bench(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(r["ok"] for r in report["logits"]) else 1


if __name__ == "__main__":
    sys.exit(main())
