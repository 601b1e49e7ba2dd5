"""The torch twin of the CUTLASS path: same activation quantization, float GEMM, same scale order.

Used on CPU (where the method runs on it, so its numerics are CPU-tested) and as the reference the CUDA
kernel is compared against. No ``torch._scaled_mm``: both fp8 operands are widened to float32.
"""
from __future__ import annotations

import torch

from nanocore.toolkit.numerics import quantize_fp8_activations as quantize_activations


def fp8_scaled_mm_torch(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """``x_scale[m] * (weight_scale[n] * (xq @ weight^T))`` in float32, rounded to ``out_dtype`` (the epilogue's order)."""
    acc = xq.float() @ weight.float().t()
    return ((acc * weight_scale.float().reshape(1, -1)) * x_scale.float().reshape(-1, 1)).to(out_dtype)


def fp8_linear_twin(x2: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K]`` times fp8 ``weight [N, K]`` the way the CUTLASS path does it, output in ``x2.dtype``."""
    xq, x_scale = quantize_activations(x2, input_scale)
    return fp8_scaled_mm_torch(xq, x_scale, weight, weight_scale, x2.dtype)
