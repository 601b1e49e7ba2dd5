"""nanocore.kernels.quant_gemm (fp8 / int8 weight-only GEMM + decode GEMV) vs its torch reference."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanocore.kernels.quant_gemm import weight_only_linear_torch
from nanocore.quant_utils import quantize_fp8_per_row, quantize_int8_per_row


def test_kernels_match_torch_reference_in_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("quant_gemm_interp.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("quantize", [quantize_fp8_per_row, quantize_int8_per_row])
@pytest.mark.parametrize("m", [1, 3, 8, 16, 100, 512])
def test_bf16_on_cuda(quantize, m):
    from nanocore.kernels.quant_gemm import weight_only_linear
    torch.manual_seed(m)
    q, scale = quantize(torch.randn(384, 512, device="cuda"))
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    expected = weight_only_linear_torch(x.float(), q, scale, bias.float())
    got = weight_only_linear(x, q, scale, bias).float()
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2
