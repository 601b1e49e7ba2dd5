"""GPU probes for the decode GEMV work: the HBM ceilings, and one kernel run alone for ``ncu``.

``python plugins_quant/decode_probe_gpu.py bandwidth OUT.json``: device-to-device copy (bytes read + written) and a
read-only reduction over 4 GiB, CUDA-event medians. ``python plugins_quant/decode_probe_gpu.py kernel NAME``: builds
a Qwen2.5-7B weight (gate_up 37888 x 3584 unless the name ends in ``_qkv`` or ``_down``) for kernel NAME (see
``KERNELS``; M = 16 if the name ends in ``16``), checks it against its torch twin, then runs it 5 times (profile it
with ``ncu -k regex:... --launch-skip 3 --launch-count 1``).
"""
from __future__ import annotations

import json
import sys

import torch
from nanocore_awq.kernels import awq_linear_gpu, awq_linear_torch, awq_linear_triton

from nanocore.bench.linear import SHAPES as LAYER_SHAPES
from nanocore.toolkit.gemm import (
    GemmConfig,
    weight_only_linear,
    weight_only_linear_torch,
)
from nanocore.toolkit.numerics import (
    awq_pack,
    quantize_fp8_per_row,
    quantize_int8_per_row,
)
from nanocore.toolkit.timing import time_ms

SHAPES = {name.removesuffix("_proj"): nk for name, nk in LAYER_SHAPES["qwen2.5-7b"].items()}  # qkv, o, gate_up, down
#: name -> (weight format, config or None for the default; "cuda" for the AWQ CUDA GEMV)
KERNELS = {
    "fp8_splitk_default": ("fp8", GemmConfig("splitk", 16, 32, 256)),  # the M = 1 default before
    "fp8_gemv": ("fp8", None),
    "int8_gemv": ("int8", None),
    "fp8_splitk16": ("fp8", GemmConfig("splitk", 16, 32, 256)),
    "awq_default": ("awq", GemmConfig("splitk", 1, 128, 128)),  # the M = 1 default before, AutoAWQ storage
    "fp8_default16": ("fp8", None),
    "awq_cuda": ("awq", "cuda"), "awq_cuda_qkv": ("awq", "cuda"), "awq_cuda_down": ("awq", "cuda"),
    "awq_triton16": ("awq", None),
}


def bandwidth() -> dict:
    n = 2 * 2**30  # bf16 elements: 4 GiB
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_()
    b = torch.empty_like(a)
    copy_ms = time_ms(lambda: b.copy_(a), min_iters=10, budget_ms=0.0)
    read_ms = time_ms(lambda: torch.amax(a), min_iters=10, budget_ms=0.0)
    return {"bytes": 2 * n, "copy_ms": copy_ms, "copy_tb_per_s_read_plus_write": 2 * 2 * n / copy_ms / 1e9,
            "read_ms": read_ms, "read_tb_per_s": 2 * n / read_ms / 1e9, "device": torch.cuda.get_device_name()}


def kernel(name: str) -> None:
    fmt, cfg = KERNELS[name]
    n, k = SHAPES[name.rsplit("_", 1)[-1]] if name.endswith(("_qkv", "_down")) else SHAPES["gate_up"]
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda") / k ** 0.5
    m = 16 if name.endswith("16") else 1
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if fmt in ("fp8", "int8"):
        q, s = (quantize_fp8_per_row if fmt == "fp8" else quantize_int8_per_row)(w)
        run, twin = (lambda: weight_only_linear(x, q, s, None, cfg)), weight_only_linear_torch(x.float(), q, s)
    else:
        p = awq_pack(w, 128, torch.bfloat16)
        twin = awq_linear_torch(x.float(), p["qweight"], p["qzeros"], p["scales"].float())
        def run():
            if cfg == "cuda":
                return awq_linear_gpu(x, **p, require_gemv=True)
            return awq_linear_triton(x, **p, config=cfg)
    err = float((run().float() - twin).abs().max() / twin.abs().max())
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    print(json.dumps({"kernel": name, "rel_err_vs_twin": err}))


if __name__ == "__main__":
    if sys.argv[1] == "bandwidth":
        result = bandwidth()
        print(json.dumps(result))
        if len(sys.argv) > 2:
            open(sys.argv[2], "w").write(json.dumps(result, indent=1))
    else:
        kernel(sys.argv[2])
