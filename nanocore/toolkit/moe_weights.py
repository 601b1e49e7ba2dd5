"""Expert weights in the ``fp8_channel`` format (see ``nanocore.interfaces.moe_executor``): rounding and its inverse.

``w13[E,2I,H]`` / ``w2[E,H,I]`` as fp8 e4m3 with one float32 scale per output row (``w13_scale[E,2I]``,
``w2_scale[E,H]``), as llm-compressor's FP8_DYNAMIC writes each expert's ``weight`` / ``weight_scale``.
"""
from __future__ import annotations

import torch

from nanocore.toolkit.numerics import FP8_DTYPE, FP8_MAX, quantize_fp8, symmetric_scale


def quantize_fp8_experts(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                       torch.Tensor]:
    """``(w13 fp8, w13_scale[E,2I], w2 fp8, w2_scale[E,H])``: absmax / 448 per output row of every expert."""
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"expert weights must be w13[E,2I,H] and w2[E,H,I], got {tuple(w13.shape)} and "
                         f"{tuple(w2.shape)}")
    s13, s2 = symmetric_scale(w13, FP8_MAX), symmetric_scale(w2, FP8_MAX)
    return quantize_fp8(w13, s13), s13.squeeze(-1), quantize_fp8(w2, s2), s2.squeeze(-1)


def dequantize_fp8_experts(w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w13, w2)`` in ``dtype`` from fp8 weights and their per-row scales (the float the format stands for)."""
    if w13.dtype != FP8_DTYPE or w2.dtype != FP8_DTYPE:
        raise ValueError(f"fp8_channel expert weights are {FP8_DTYPE}, got {w13.dtype} and {w2.dtype}")
    return ((w13.float() * w13_scale.float()[..., None]).to(dtype),
            (w2.float() * w2_scale.float()[..., None]).to(dtype))
