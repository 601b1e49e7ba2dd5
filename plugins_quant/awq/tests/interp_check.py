"""Run under TRITON_INTERPRET=1 (tests/test_kernels.py starts it): AWQ Triton kernels vs the torch twin."""
import itertools
import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
from nanocore.kernels.quant_gemm import GemmConfig  # noqa: E402
from nanocore.quant_utils import awq_pack  # noqa: E402
from nanocore_awq.kernels import awq_linear_torch, awq_linear_triton  # noqa: E402

# None = the default config for the shape; then split-K (FMA and tl.dot) and tiled variants
CONFIGS = [None, GemmConfig("splitk", 1, 16, 32, 2), GemmConfig("splitk", 16, 16, 32, 3),
           GemmConfig("tiled", 16, 32, 32)]
torch.manual_seed(0)
failures = []
for (m, n, k, group), dtype, with_bias, cfg in itertools.product(
        [(1, 40, 128, 128), (3, 16, 256, 128), (8, 72, 64, 32), (9, 24, 256, 128), (70, 136, 128, 64)],
        [torch.float16, torch.float32], [False, True], CONFIGS):
    if cfg is not None and (cfg.block_m == 1 and m > 1 or dtype == torch.float16):
        continue  # block_m=1 serves M=1 only; variants run in float32 only, to keep the interpreter quick
    packed = awq_pack(torch.randn(n, k), group)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    expected = awq_linear_torch(x.float(), packed["qweight"], packed["qzeros"], packed["scales"].float(),
                                None if bias is None else bias.float())
    for _ in range(2):  # the second call checks that the split-K counters were reset
        got = awq_linear_triton(x, packed["qweight"], packed["qzeros"], packed["scales"], bias, cfg).float()
    tol = 3e-3 if dtype == torch.float16 else 1e-5
    err = float((got - expected).abs().max() / expected.abs().max())
    if not err <= tol:
        failures.append(f"m={m} n={n} k={k} g={group} {dtype} bias={with_bias} {cfg}: error {err:.3g} > {tol}")
print("\n".join(failures) or "ok")
sys.exit(1 if failures else 0)
