"""GPU sweep of the AWQ CUDA GEMV's launch plans on the Qwen2.5-7B layer's four linears, against the Triton GEMV
and bf16 ``F.linear`` (CUDA-graph replay after an L2 flush, summed over the four), each variant checked first.

``source benchmarks/gpu_setup.sh && python plugins_quant/awq_gemv_tune_gpu.py OUTDIR`` (about a minute: one nvcc
build, then graph timings). Writes OUTDIR/awq_gemv_tune.json; prints per M the default plan and the best.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from nanocore_awq.gemv_cuda import GemvPlan, awq_gemv_cuda, gemv_plan, gemv_reason
from nanocore_awq.kernels import awq_linear_torch, awq_linear_triton

from nanocore.bench.linear import SHAPES as LAYER_SHAPES
from nanocore.toolkit.numerics import awq_pack
from nanocore.toolkit.timing import graph_time_ms

SHAPES = LAYER_SHAPES["qwen2.5-7b"]  # the four linears of one Qwen2.5-7B layer, as `bench linear` runs them
PLANS = [GemvPlan(w, r) for w in (1, 2, 4) for r in (32, 64, 128, 256, 512)]


def main(out: Path) -> None:
    start = time.time()
    reason = gemv_reason(torch.device("cuda"))
    print("gemv build:", reason or f"ok in {time.time() - start:.1f} s", flush=True)
    if reason:
        sys.exit(1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    weights = {name: {k: v.cuda() for k, v in awq_pack(torch.randn(n, k) * 0.02, 128, torch.bfloat16).items()}
               for name, (n, k) in SHAPES.items()}
    dense = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for name, (n, k) in SHAPES.items()}
    rows = []
    for m in (1, 2, 4):
        xs = {name: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for name, (_, k) in SHAPES.items()}
        record = {"m": m,
                  "bf16_ms": sum(graph_time_ms(lambda n=n, xs=xs: F.linear(xs[n], dense[n])) for n in SHAPES),
                  "triton_ms": sum(graph_time_ms(lambda n=n, xs=xs: awq_linear_triton(xs[n], **weights[n]))
                                   for n in SHAPES)}
        errors, plans = {}, {}
        for plan in PLANS + [None]:
            if plan is not None and plan.words * m > 4:
                continue
            total, worst, per_shape = 0.0, 0.0, {}
            for name, (n, k) in SHAPES.items():
                chosen = plan or gemv_plan(n, k, sms)
                if (n // 8) % chosen.words:
                    total = float("nan")
                    break
                got = awq_gemv_cuda(xs[name], **weights[name], plan=chosen).float()
                ref = awq_linear_torch(xs[name].float(), weights[name]["qweight"], weights[name]["qzeros"],
                                       weights[name]["scales"].float())
                worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
                per_shape[name] = graph_time_ms(lambda n=name, p=chosen, xs=xs: awq_gemv_cuda(xs[n], **weights[n], plan=p))
                total += per_shape[name]
            key = "default" if plan is None else f"w{plan.words}_r{plan.rows_per_split}"
            plans[key], errors[key] = total, worst
            record.setdefault("per_shape_ms", {})[key] = per_shape
        record.update(plans=plans, errors_vs_twin=errors,
                      default_plans={n: vars(gemv_plan(*SHAPES[n], sms)) for n in SHAPES})
        best = min((v, k) for k, v in plans.items() if not math.isnan(v))
        print(f"M={m}: bf16 {record['bf16_ms']:.4f} ms, triton {record['triton_ms']:.4f}, default "
              f"{plans['default']:.4f} ({record['bf16_ms'] / plans['default']:.2f}x bf16), best {best[1]} "
              f"{best[0]:.4f}; worst error {max(errors.values()):.2e}", flush=True)
        for shape in SHAPES:
            timed = {key: t[shape] for key, t in record["per_shape_ms"].items() if shape in t}
            fastest = min(timed, key=timed.get)
            print(f"  {shape}: default {timed['default'] * 1e3:.1f} us, best {fastest} {timed[fastest] * 1e3:.1f} us",
                  flush=True)
        rows.append(record)
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
            "weight_mb_int4": sum(n * k / 2 / 1e6 for n, k in SHAPES.values())}
    (out / "awq_gemv_tune.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
