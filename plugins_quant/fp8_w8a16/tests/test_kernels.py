"""Triton fp8 GEMM / GEMV vs the torch twin: in the Triton interpreter on CPU, in bf16 on a GPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanocore.quant_utils import FP8_MAX, quantize_fp8_per_row
from nanocore_fp8.kernels import fp8_linear_torch


def test_triton_kernels_match_torch_twin_in_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("interp_check.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_torch_twin_is_dequantize_then_linear():
    w = torch.randn(24, 40)
    q, scale = quantize_fp8_per_row(w)
    x = torch.randn(3, 40)
    expected = x @ (q.float() * scale).t()
    torch.testing.assert_close(fp8_linear_torch(x, q, scale), expected, rtol=1e-5, atol=1e-5)
    assert float(q.float().abs().max()) == FP8_MAX  # each row's largest weight uses the full e4m3 range


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 3, 8, 16, 100, 512])
def test_triton_bf16_on_cuda(m):
    from nanocore_fp8.kernels import fp8_linear_triton
    torch.manual_seed(m)
    q, scale = quantize_fp8_per_row(torch.randn(384, 512, device="cuda"))
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    expected = fp8_linear_torch(x.float(), q, scale, bias.float())
    got = fp8_linear_triton(x, q, scale, bias).float()
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2
