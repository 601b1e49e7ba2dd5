"""The fp8 torch twin; the Triton kernels themselves are tested in the core (tests/test_quant_gemm.py)."""
import torch

from nanocore.quant_utils import FP8_MAX, quantize_fp8_per_row
from nanocore_fp8.kernels import fp8_linear_torch


def test_torch_twin_is_dequantize_then_linear():
    w = torch.randn(24, 40)
    q, scale = quantize_fp8_per_row(w)
    x = torch.randn(3, 40)
    expected = x @ (q.float() * scale).t()
    torch.testing.assert_close(fp8_linear_torch(x, q, scale), expected, rtol=1e-5, atol=1e-5)
    assert float(q.float().abs().max()) == FP8_MAX  # each row's largest weight uses the full e4m3 range
