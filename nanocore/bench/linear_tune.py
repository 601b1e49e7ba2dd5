"""`nanocore tune linear`: time every kernel of each weight-only method per M on this GPU, pick the fastest.

For one model's layer shapes (``bench linear``'s ``SHAPES``), each method is built through the plugin registry, as
``bench linear`` builds it, and its four linears are captured in one CUDA graph per candidate (L2 flushed before
each replay; ``toolkit.timing.graph_time_ms``): the method as shipped (``plan``, the kernels
``toolkit.kernel_plan.KERNEL_PLANS`` names), the toolkit's ``mma`` tiles of ``TILES`` (and with ``swap_ab`` off),
``dequant``, and for fp8 ``scaled_mm``; bf16 (``unquantized``) in the same run. Every candidate's output is checked
against the method's torch twin first (a wrong kernel is never timed). Prints per (method, M) the fastest candidate
and its ratio x bf16; the JSON keeps every time. The thresholds in ``KERNEL_PLANS`` and the tiles in
``gemm_config.MMA_TILES`` are read off it.
"""
from __future__ import annotations

import dataclasses

import torch

from nanocore.bench.linear import BASELINE, DTYPES, SHAPES, build_layer, installed_methods
from nanocore.toolkit.gemm import GemmConfig, weight_only_linear
from nanocore.toolkit.gemm_int4 import awq_dequantize_gpu, awq_mma_linear
from nanocore.toolkit.timing import graph_time_ms

#: mma tiles tried: (block_m tokens, block_n weight rows, block_k, warps, stages).
TILES = ((64, 128, 128, 4, 4), (64, 64, 128, 4, 4), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3),
         (128, 256, 64, 8, 3))
#: Below this M only the shipped plan is timed (the GEMV / split-K range, where tiles leave most SMs idle).
MIN_TILED_M = 32
METHODS = ("int8_w8a16", "fp8_w8a16", "awq")


def candidate_configs(method: str) -> dict[str, GemmConfig]:
    out = {f"mma{t}": GemmConfig("mma", *t[:3], num_warps=t[3], num_stages=t[4]) for t in TILES}
    out["mma_noswap(128,128,64,8,4)"] = GemmConfig("mma", 128, 128, 64, num_warps=8, num_stages=4, swap_ab=False)
    if method == "int8_w8a16":
        out["mma_cvt(128,128,64,8,4)"] = GemmConfig("mma", 128, 128, 64, num_warps=8, num_stages=4,
                                                    fast_widen=False)
    out["dequant"] = GemmConfig("dequant")
    if method == "fp8_w8a16":
        out["scaled_mm"] = GemmConfig("scaled_mm")
    return out


def run_config(method: str, layer, x: torch.Tensor, cfg: GemmConfig) -> torch.Tensor:
    """One linear of ``layer`` (built by ``method``) with the toolkit kernel ``cfg``."""
    if method != "awq":
        return weight_only_linear(x, layer.weight, layer.weight_scale, None, cfg)
    if cfg.kind == "dequant":
        return x @ awq_dequantize_gpu(layer.qweight, layer.qzeros, layer.scales, x.dtype)
    y = torch.empty((x.shape[0], layer.scales.shape[1]), dtype=x.dtype, device=x.device)
    awq_mma_linear(x, layer.qweight, layer.qzeros, layer.scales, None, y, cfg)
    return y


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def tune_method(name: str, cls, shapes: dict, ms: list[int], dtype, device) -> list[dict]:
    """Rows (method, M, candidate, ms, rel_err vs the torch twin) for one method."""
    built = []
    for n, k in shapes.values():
        weight = torch.randn(n, k, device=device, generator=torch.Generator(device).manual_seed(n + k)) * k ** -0.5
        twin = build_layer(cls, {"kernel": "torch"}, weight, dtype) if name != BASELINE else None
        built.append((build_layer(cls, {}, weight, dtype), twin))
    rows = []
    for m in ms:
        xs = [torch.randn(m, k, device=device, dtype=dtype) for _, k in shapes.values()]
        cands = {"plan": None} if name == BASELINE or m < MIN_TILED_M else {"plan": None, **candidate_configs(name)}
        for cand, cfg in cands.items():
            def call(x, built_one, cfg=cfg):
                (method, layer), _ = built_one
                return method.apply(layer, x) if cfg is None else run_config(name, layer, x, cfg)
            row = {"method": name, "m": m, "candidate": cand, "config": dataclasses.asdict(cfg) if cfg else None}
            try:
                if name != BASELINE:
                    row["rel_err"] = max(_rel_err(call(x, b), b[1][0].apply(b[1][1], x)) for x, b in zip(xs, built))
                row["ms"] = graph_time_ms(lambda: [call(x, b) for x, b in zip(xs, built)])
            except Exception as exc:  # a tile that does not compile or fit: recorded, the sweep goes on
                row["error"] = repr(exc)[:300]
            rows.append(row)
    built.clear()
    torch.cuda.empty_cache()
    return rows


def best_rows(rows: list[dict], tolerance: dict[str, float]) -> list[dict]:
    """Per (method, M): the fastest candidate within the method's tolerance, and its ratio x bf16."""
    base = {r["m"]: r["ms"] for r in rows if r["method"] == BASELINE and "ms" in r}
    out = []
    for (name, m) in dict.fromkeys((r["method"], r["m"]) for r in rows if r["method"] != BASELINE):
        ok = [r for r in rows if r["method"] == name and r["m"] == m and "ms" in r
              and r.get("rel_err", 0.0) <= tolerance[name]]
        plan = next((r["ms"] for r in ok if r["candidate"] == "plan"), None)
        best = min(ok, key=lambda r: r["ms"], default=None)
        out.append({"method": name, "m": m, "bf16_ms": base.get(m), "plan_ms": plan,
                    "plan_x_bf16": base[m] / plan if plan and m in base else None,
                    "best": best and best["candidate"], "best_ms": best and best["ms"],
                    "best_x_bf16": base[m] / best["ms"] if best and m in base else None})
    return out


def run_tune_linear(args) -> int:
    from nanocore.bench.report import environment, format_table, write_json

    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    ms = [int(m) for m in args.ms.split(",")]
    methods, skipped = installed_methods(device, [BASELINE, *(args.methods.split(",") if args.methods else METHODS)])
    rows = []
    for name, cls in methods.items():
        rows += tune_method(name, cls, SHAPES[args.shapes], ms, dtype, device)
    best = best_rows(rows, {name: entry.cls.tolerance[0] for name, entry in methods.items()})
    print(f"tune linear: one {args.shapes} layer, {dtype}, {torch.cuda.get_device_name()}")
    print(format_table(best))
    write_json(args.json, {"command": "tune linear", "shapes": args.shapes, "ms": ms, "skipped": skipped,
                           "best": best, "rows": rows, "environment": environment(str(device))})
    return 0
