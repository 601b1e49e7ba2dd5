"""fp8-weight GEMMs: the Triton kernels live once in the core (``nanocore.toolkit.gemm``, shared with
int8); this module names them for fp8 and keeps the torch twin beside them."""
from __future__ import annotations

from nanocore.toolkit.gemm import DECODE_MAX_M, weight_only_linear, weight_only_linear_torch

#: The torch twin: dequantize the fp8 weight, then ``F.linear``.
fp8_linear_torch = weight_only_linear_torch
#: ``x [..., K]`` times fp8 ``weight [N, K]`` with per-channel ``scale``: split-K GEMV for small M, else tiled.
fp8_linear_triton = weight_only_linear

__all__ = ["DECODE_MAX_M", "fp8_linear_torch", "fp8_linear_triton"]
