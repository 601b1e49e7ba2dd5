"""Run under TRITON_INTERPRET=1 (tests/test_kernels.py starts it): AWQ Triton kernels vs the torch twin."""
import itertools
import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
from nanocore.quant_utils import awq_pack  # noqa: E402
from nanocore_awq.kernels import awq_linear_torch, awq_linear_triton  # noqa: E402

torch.manual_seed(0)
failures = []
for (m, n, k, group), dtype, with_bias in itertools.product(
        [(1, 40, 128, 128), (3, 16, 256, 128), (8, 72, 64, 32), (9, 24, 256, 128), (70, 136, 128, 64)],
        [torch.float16, torch.float32], [False, True]):
    packed = awq_pack(torch.randn(n, k), group)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    expected = awq_linear_torch(x.float(), packed["qweight"], packed["qzeros"], packed["scales"].float(),
                                None if bias is None else bias.float())
    got = awq_linear_triton(x, packed["qweight"], packed["qzeros"], packed["scales"], bias).float()
    tol = 3e-3 if dtype == torch.float16 else 1e-5
    err = float((got - expected).abs().max() / expected.abs().max())
    if not err <= tol:
        failures.append(f"m={m} n={n} k={k} g={group} {dtype} bias={with_bias}: error {err:.3g} > {tol}")
print("\n".join(failures) or "ok")
sys.exit(1 if failures else 0)
