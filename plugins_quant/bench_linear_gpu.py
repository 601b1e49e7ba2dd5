"""GPU check + microbenchmark of every quantized linear method on Qwen2.5-7B layer shapes (writes JSON).

Runs without nanocore's registry or pydantic: ``PYTHONPATH=.:plugins_quant/fp8_w8a16:plugins_quant/int8_w8a8:plugins_quant/awq
python plugins_quant/bench_linear_gpu.py OUT.json``. Times are CUDA-event medians (triton.testing.do_bench).
"""
import json
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from nanocore.quant_utils import awq_pack, quantize_fp8_per_row, quantize_int8_per_row
from nanocore.kernels.quant_gemm import weight_only_linear, weight_only_linear_torch
from nanocore_awq.kernels import awq_linear_torch, awq_linear_triton
from nanocore_fp8.methods import Fp8W8A8LinearMethod, Fp8W8A16LinearMethod
from nanocore_int8.methods import Int8W8A8LinearMethod, Int8W8A16LinearMethod

SHAPES = {"qkv_proj": (4608, 3584), "o_proj": (3584, 3584), "gate_up_proj": (37888, 3584), "down_proj": (3584, 18944)}
MS = [1, 16, 256, 1024, 4096]


def layer_for(method_cls, w, options=None):
    layer, method = torch.nn.Module(), method_cls(options or {})
    method_cls.name = method_cls.name or method_cls.__name__
    q, s = (quantize_fp8_per_row if "Fp8" in method_cls.__name__ else quantize_int8_per_row)(w)
    layer.weight, layer.weight_scale = torch.nn.Parameter(q, False), torch.nn.Parameter(s, False)
    return lambda x: method.apply(layer, x), q.numel() * q.element_size() + s.numel() * 4


def builders(w):
    awq = awq_pack(w, 128, torch.bfloat16)
    wb = w.to(torch.bfloat16)
    return {
        "bf16": (lambda x: F.linear(x, wb), wb.numel() * 2),
        "fp8_w8a16": layer_for(Fp8W8A16LinearMethod, w),
        "fp8_w8a8": layer_for(Fp8W8A8LinearMethod, w),
        "int8_w8a16": layer_for(Int8W8A16LinearMethod, w),
        "int8_w8a8": layer_for(Int8W8A8LinearMethod, w),
        "awq": (lambda x: awq_linear_triton(x, **awq), sum(t.numel() * t.element_size() for t in awq.values())),
    }


def correctness():
    out = {}
    torch.manual_seed(0)
    for m in [1, 3, 8, 9, 16, 100, 512]:
        w = torch.randn(1024, 2048, device="cuda") / 45
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), w)
        for name, (fn, _) in builders(w).items():
            y = fn(x).float()
            out[f"{name}_m{m}_rel_err_vs_fp32"] = float((y - ref).abs().max() / ref.abs().max())
        for qname, quant in (("fp8", quantize_fp8_per_row), ("int8", quantize_int8_per_row)):
            q, s = quant(w)
            twin = weight_only_linear_torch(x.float(), q, s)
            out[f"kernel_{qname}_m{m}_vs_twin"] = float((weight_only_linear(x, q, s).float() - twin).abs().max() / twin.abs().max())
        awq = awq_pack(w, 128, torch.bfloat16)
        twin = awq_linear_torch(x.float(), awq["qweight"], awq["qzeros"], awq["scales"].float())
        out[f"kernel_awq_m{m}_vs_twin"] = float((awq_linear_triton(x, **awq).float() - twin).abs().max() / twin.abs().max())
    return out


def timings():
    rows = []
    for shape_name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda") / k ** 0.5
        fns = builders(w)
        for m in MS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for name, (fn, nbytes) in fns.items():
                try:
                    ms = do_bench(lambda: fn(x), warmup=10, rep=40)
                except Exception as exc:  # report, keep measuring the rest
                    rows.append({"shape": shape_name, "m": m, "method": name, "error": repr(exc)[:300]})
                    continue
                rows.append({"shape": shape_name, "n": n, "k": k, "m": m, "method": name, "ms": ms,
                             "weight_bytes": nbytes, "tflops": 2 * m * n * k / ms / 1e9,
                             "weight_gbps": nbytes / ms / 1e6})
        del fns
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["correctness"] = correctness()
    result["timings"] = timings()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
    by = {}
    for r in result["timings"]:
        if "ms" in r:
            by.setdefault((r["m"], r["method"]), 0.0)
            by[(r["m"], r["method"])] += r["ms"]
    methods = ["bf16", "fp8_w8a16", "fp8_w8a8", "int8_w8a16", "int8_w8a8", "awq"]
    print("one Qwen2.5-7B layer's four linears, ms (speed-up vs bf16)")
    print("M".rjust(6) + "".join(m.rjust(18) for m in methods))
    for m in MS:
        base = by.get((m, "bf16"), float("nan"))
        print(str(m).rjust(6) + "".join(f"{by.get((m, k), float('nan')):.4f} ({base / by.get((m, k), float('nan')):.2f}x)".rjust(18) for k in methods))
    print(json.dumps(result["correctness"]))
