"""Run under TRITON_INTERPRET=1 (tests/test_kernels.py starts it): Triton kernels vs the torch twin."""
import itertools
import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
from nanocore.quant_utils import quantize_fp8_per_row  # noqa: E402
from nanocore_fp8.kernels import fp8_linear_torch, fp8_linear_triton  # noqa: E402

torch.manual_seed(0)
failures = []
for (m, n, k), dtype, with_bias in itertools.product(
        [(1, 40, 72), (2, 33, 130), (5, 16, 64), (8, 24, 200), (9, 70, 100), (40, 65, 96), (130, 48, 136)],
        [torch.float16, torch.float32], [False, True]):
    q, scale = quantize_fp8_per_row(torch.randn(n, k) * 0.3)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    expected = fp8_linear_torch(x.float(), q, scale, None if bias is None else bias.float())
    got = fp8_linear_triton(x, q, scale, bias).float()
    tol = 2e-3 if dtype == torch.float16 else 2e-5
    err = float((got - expected).abs().max() / expected.abs().max())
    if not err <= tol:
        failures.append(f"m={m} n={n} k={k} {dtype} bias={with_bias}: relative error {err:.3g} > {tol}")
print("\n".join(failures) or "ok")
sys.exit(1 if failures else 0)
