"""GPU check of ``cutlass`` on one H100/H200: compile time, numerics, and timings on Qwen2.5-7B layer shapes.

Usage (repo root, after ``source benchmarks/gpu_setup.sh``):
    python benchmarks/cutlass_gpu_check.py OUTDIR [--fresh]

1. Compiles the extension (timed; ``--fresh`` forces a cold build in a temporary cache, else the normal cache
   ``$NANOCORE_CACHE_DIR/cutlass`` is used and the JSON says whether the build was cold), then times a warm load.
2. Numerics per shape and M: the activation-quantization kernel vs the twin (fp8 bytes), the CUTLASS GEMM vs the
   float32 twin and vs ``torch._scaled_mm`` on the same fp8 operands.
3. Median times (triton do_bench, L2 flushed) of bf16 ``F.linear``, the CUTLASS GEMM alone, ``torch._scaled_mm``
   alone, and the full paths (activation quantization + GEMM: ``cutlass`` apply, torch quantize + _scaled_mm as
   ``fp8_w8a8`` does) for M in {1, 16, 256, 1024, 4096}.
Writes OUTDIR/cutlass_gpu_check.json; prints a table of per-layer sums. Expected wall time: 60-120 s for the
compile (two GEMM units built in parallel) plus about 40 s of measurements; hard budget 240 s (later sections
are skipped, and say so, once it is spent). Never stops at the first failure: errors are recorded per row.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BUDGET_S = 230.0
START = time.perf_counter()
SHAPES = {"qkv_proj": (4608, 3584), "o_proj": (3584, 3584), "gate_up_proj": (37888, 3584), "down_proj": (3584, 18944)}
MS = [1, 16, 256, 1024, 4096]
VARIANTS = ["bf16", "cutlass_gemm", "scaled_mm_gemm", "cutlass_apply", "scaled_mm_apply"]


def elapsed() -> float:
    return time.perf_counter() - START


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def compile_section(result: dict, fresh: bool):
    if fresh:
        os.environ["NANOCORE_CACHE_DIR"] = tempfile.mkdtemp(prefix="nanocore_cutlass_cache_")
    import torch

    from nanocore_cutlass import CutlassFp8LinearMethod, build

    CutlassFp8LinearMethod.name = "cutlass"
    dirs, source = build.cutlass_include_dirs()
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()), "nvcc": build.nvcc_path(),
            "headers": source, "include_dirs": [str(d) for d in dirs or []], "cache_dir": str(build.cache_root()),
            "max_jobs": os.environ.get("MAX_JOBS"), "cpus": os.cpu_count()}
    try:
        info["nvcc_version"] = subprocess.run([info["nvcc"], "--version"], capture_output=True, text=True,
                                              timeout=30).stdout.strip().splitlines()[-1]
    except Exception as exc:
        info["nvcc_version"] = error_text(exc)
    info["supports"] = CutlassFp8LinearMethod.supports(torch.device("cuda"))
    directory = build.build_dir()
    info["cold_build"] = not (directory and any(directory.glob("*.so")))
    result["env"] = info
    start = time.perf_counter()
    try:
        extension = build.load_extension()
    except Exception as exc:
        info["compile_error"] = error_text(exc)
        log = directory / "build.log" if directory else None
        if log is not None and log.is_file():
            info["build_log_tail"] = log.read_text()[-6000:]
        return None
    info["compile_s"] = time.perf_counter() - start
    build._loaded.clear()
    start = time.perf_counter()
    extension = build.load_extension()
    info["warm_load_s"] = time.perf_counter() - start
    return extension


def rel_err(y, ref) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def numerics_row(extension, shape, n, k, m, weight, wq, ws):
    import torch

    from nanocore_cutlass.twin import fp8_scaled_mm_torch, quantize_activations

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * torch.rand(m, 1, device="cuda").add(0.1).bfloat16()
    xq, xs = extension.quantize_fp8_rows(x, k, None)
    xq_twin, xs_twin = quantize_activations(x)
    y = extension.fp8_scaled_mm(xq, wq, xs.view(-1), ws.view(-1), torch.bfloat16)
    twin = fp8_scaled_mm_torch(xq, xs, wq, ws, torch.float32)
    scaled = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16)
    return {"shape": shape, "n": n, "k": k, "m": m,
            "quant_byte_mismatch": float((xq.view(torch.uint8) != xq_twin.view(torch.uint8)).float().mean()),
            "quant_scale_max_diff": float((xs - xs_twin).abs().max()),
            "cutlass_vs_twin": rel_err(y, twin), "scaled_mm_vs_twin": rel_err(scaled, twin),
            "cutlass_vs_scaled_mm": rel_err(y, scaled), "cutlass_vs_bf16_exact": rel_err(y, x.float() @ weight.t())}


def timing_fns(extension, method, layer, x, weight_bf16, wq, ws):
    import torch
    import torch.nn.functional as F

    from nanocore.toolkit.numerics import quantize_fp8_per_row

    xq, xs = extension.quantize_fp8_rows(x, x.shape[1], None)
    ws_row, ws_vec, xs_vec = ws.view(1, -1), ws.view(-1), xs.view(-1)

    def scaled_mm_apply():
        q, s = quantize_fp8_per_row(x)
        return torch._scaled_mm(q, wq.t(), scale_a=s, scale_b=ws_row, out_dtype=torch.bfloat16)

    return {"bf16": lambda: F.linear(x, weight_bf16),
            "cutlass_gemm": lambda: extension.fp8_scaled_mm(xq, wq, xs_vec, ws_vec, torch.bfloat16),
            "scaled_mm_gemm": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_row, out_dtype=torch.bfloat16),
            "cutlass_apply": lambda: method.apply(layer, x),
            "scaled_mm_apply": scaled_mm_apply}


def shape_section(extension, shape, n, k, numerics: list, timings: list):
    import torch
    from triton.testing import do_bench

    from nanocore.bench.linear import build_layer
    from nanocore.plugins import get_registry

    g = torch.Generator(device="cuda").manual_seed(n + k)
    weight = torch.randn(n, k, device="cuda", generator=g) * k ** -0.5
    method, layer = build_layer(get_registry().get("linear_method", "cutlass"), {}, weight, torch.bfloat16)
    wq, ws = layer.weight, layer.weight_scale
    weight_bf16 = weight.to(torch.bfloat16)
    for m in MS:
        if elapsed() > BUDGET_S:
            timings.append({"shape": shape, "m": m, "error": "skipped: time budget spent"})
            continue
        try:
            numerics.append(numerics_row(extension, shape, n, k, m, weight, wq, ws))
        except Exception as exc:
            numerics.append({"shape": shape, "m": m, "error": error_text(exc)})
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"shape": shape, "n": n, "k": k, "m": m}
        try:
            fns = timing_fns(extension, method, layer, x, weight_bf16, wq, ws)
        except Exception as exc:
            fns, row["error"] = {}, error_text(exc)
        for name, fn in fns.items():
            try:
                row[f"{name}_ms"] = float(do_bench(fn, warmup=10, rep=40))
            except Exception as exc:
                row[f"{name}_error"] = error_text(exc)
        timings.append(row)
    del layer, weight, weight_bf16
    torch.cuda.empty_cache()


def summarise(timings: list) -> list:
    """Per M: the four linears summed per variant, and speed-ups over bf16."""
    out = []
    for m in MS:
        rows = [r for r in timings if r.get("m") == m]
        entry = {"m": m}
        for name in VARIANTS:
            times = [r.get(f"{name}_ms") for r in rows]
            entry[f"{name}_layer_ms"] = sum(times) if len(times) == len(SHAPES) and None not in times else None
        base = entry["bf16_layer_ms"]
        for name in VARIANTS[1:]:
            t = entry[f"{name}_layer_ms"]
            entry[f"{name}_speedup_vs_bf16"] = base / t if base and t else None
        out.append(entry)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--fresh", action="store_true", help="cold compile in a temporary cache")
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    result: dict = {"numerics": [], "timings": []}
    path = args.outdir / "cutlass_gpu_check.json"
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False  # the float32 twin must be exact
        extension = compile_section(result, args.fresh)
        if extension is not None:
            for shape, (n, k) in SHAPES.items():
                try:
                    shape_section(extension, shape, n, k, result["numerics"], result["timings"])
                except Exception as exc:
                    result["timings"].append({"shape": shape, "error": error_text(exc)})
            result["summary"] = summarise(result["timings"])
    except Exception:
        result["fatal"] = traceback.format_exc()[-4000:]
    result["wall_s"] = elapsed()
    path.write_text(json.dumps(result, indent=2))
    report(result, path)
    return 0 if "fatal" not in result and "compile_error" not in result.get("env", {}) else 1


def report(result: dict, path: Path) -> None:
    env = result.get("env", {})
    print(f"cutlass gpu_check: {env.get('gpu')} torch {env.get('torch')} cuda {env.get('cuda')}; headers: {env.get('headers')}")
    print(f"compile {env.get('compile_s', float('nan')):.1f} s (cold={env.get('cold_build')}), "
          f"warm load {env.get('warm_load_s', float('nan')):.2f} s")
    for key in ("supports", "compile_error", "build_log_tail", "fatal"):
        if result.get(key) or env.get(key):
            print(f"{key}: {(result.get(key) or env.get(key))[-1500:]}")
    errs = [r for r in result["numerics"] if "cutlass_vs_twin" in r]
    if errs:
        print("worst rel err: cutlass vs twin {:.2e}, _scaled_mm vs twin {:.2e}, cutlass vs _scaled_mm {:.2e}, "
              "quant byte mismatch {:.1e}".format(*(max(r[k] for r in errs) for k in (
                  "cutlass_vs_twin", "scaled_mm_vs_twin", "cutlass_vs_scaled_mm", "quant_byte_mismatch"))))
    failures = [r for r in result["numerics"] + result["timings"] if "error" in r or any(k.endswith("_error") for k in r)]
    for r in failures[:8]:
        print("error:", {k: v for k, v in r.items() if "error" in k or k in ("shape", "m")})
    print(f"{'M':>5} " + " ".join(f"{v:>16}" for v in VARIANTS) + "   (layer ms: qkv+o+gate_up+down; x = vs bf16)")
    for s in result.get("summary", []):
        cells = []
        for v in VARIANTS:
            t, sp = s.get(f"{v}_layer_ms"), s.get(f"{v}_speedup_vs_bf16")
            cells.append("-" if t is None else f"{t:.3f}" + (f" {sp:.2f}x" if sp else ""))
        print(f"{s['m']:>5} " + " ".join(f"{c:>16}" for c in cells))
    print(f"wrote {path} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
