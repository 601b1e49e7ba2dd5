"""Run under TRITON_INTERPRET=1 (tests/test_quant_gemm.py starts it): quant_gemm kernels vs the torch reference."""
import itertools
import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
from nanocore.kernels.quant_gemm import weight_only_linear, weight_only_linear_torch  # noqa: E402
from nanocore.quant_utils import quantize_fp8_per_row, quantize_int8_per_row  # noqa: E402

torch.manual_seed(0)
failures = []
for (m, n, k), quantize, dtype, with_bias in itertools.product(
        [(1, 40, 72), (2, 33, 130), (5, 16, 64), (8, 24, 200), (9, 70, 100), (40, 65, 96), (130, 48, 136)],
        [quantize_fp8_per_row, quantize_int8_per_row], [torch.float16, torch.float32], [False, True]):
    q, scale = quantize(torch.randn(n, k) * 0.3)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    expected = weight_only_linear_torch(x.float(), q, scale, None if bias is None else bias.float())
    got = weight_only_linear(x, q, scale, bias).float()
    tol = 2e-3 if dtype == torch.float16 else 2e-5
    err = float((got - expected).abs().max() / expected.abs().max())
    if not err <= tol:
        failures.append(f"{quantize.__name__} m={m} n={n} k={k} {dtype} bias={with_bias}: error {err:.3g} > {tol}")
print("\n".join(failures) or "ok")
sys.exit(1 if failures else 0)
