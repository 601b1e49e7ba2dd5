"""Run under TRITON_INTERPRET=1 (test_kernels.py starts it): every quant_gemm kernel variant vs the torch twin."""
import itertools
import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
from nanocore.kernels import quant_gemm  # noqa: E402
from nanocore.kernels.quant_gemm import (GemmConfig, int8_scaled_linear, weight_only_linear,  # noqa: E402
                                         weight_only_linear_torch)
from nanocore.quant_utils import quantize_fp8_per_row, quantize_int8_per_row  # noqa: E402

CONFIGS = [GemmConfig("splitk", 1, 16, 32, 3), GemmConfig("splitk", 2, 8, 64, 2), GemmConfig("splitk", 16, 16, 32, 4),
           GemmConfig("splitk", 16, 32, 64, 1), GemmConfig("tiled", 16, 16, 32), GemmConfig("tiled", 32, 32, 16)]
torch.manual_seed(0)
failures = []
for (m, n, k), cfg, quantize in itertools.product([(1, 40, 200), (2, 33, 130), (13, 24, 96), (20, 48, 160)], CONFIGS,
                                                  [quantize_fp8_per_row, quantize_int8_per_row]):
    if cfg.block_m < m and cfg.kind == "splitk" and cfg.block_m < 16:
        continue
    q, scale = quantize(torch.randn(n, k) * 0.3)
    x, bias = torch.randn(m, k), torch.randn(n)
    for _ in range(2):  # the second call checks that the split-K counters were reset
        got = weight_only_linear(x, q, scale, bias, cfg)
    expected = weight_only_linear_torch(x, q, scale, bias)
    err = float((got - expected).abs().max() / expected.abs().max())
    if not err <= 2e-5:
        failures.append(f"{quantize.__name__} m={m} n={n} k={k} {cfg}: error {err:.3g}")
for m, n, k in [(17, 24, 64), (40, 40, 96)]:
    w, ws = quantize_int8_per_row(torch.randn(n, k))
    xq, xs = quantize_int8_per_row(torch.randn(m, k))
    bias = torch.randn(n)
    got = int8_scaled_linear(xq, xs, w, ws, bias, torch.float32, GemmConfig("tiled", 16, 16, 32))
    expected = (xq.double() @ w.double().t()).float() * xs * ws.view(1, -1) + bias
    if not float((got - expected).abs().max() / expected.abs().max()) <= 1e-5:
        failures.append(f"int8_scaled_linear m={m} n={n} k={k}")
if any(int(t.abs().sum()) for t in quant_gemm._LOCKS.values()):
    failures.append("split-K arrival counters were not reset to zero")
print("\n".join(failures) or "ok")
sys.exit(1 if failures else 0)
