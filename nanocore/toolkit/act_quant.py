"""Dynamic per-token activation quantization for W8A8 GEMMs in one pass (since 1.4).

``quantize_per_token(x2, dtype)`` gives the int8 or fp8 e4m3 rows of ``x2 [M, K]`` and float32 scales ``[M, 1]``
with the numbers ``toolkit.numerics.quantize_int8_per_row`` / ``quantize_fp8_per_row`` give on a GPU (scale =
amax times the float32 reciprocal of qmax, at least 1e-12: torch on CUDA turns ``amax / qmax`` into that multiply,
while on the CPU it divides, one ulp apart at times; int8 rounds half to even and saturates at +-127, fp8 rounds to
nearest even and saturates at +-448; a row holding NaN or Inf gets a NaN scale or NaN codes as there: fp8 NaN, int8
undefined). On a GPU one Triton program per row reads the row twice (amax, then quantize: the second read mostly hits
L2) and writes one byte per element; the torch reference materializes several float32 copies of ``x`` (about 40
bytes per element, which at prefill sizes cost more than the int8 / fp8 GEMM itself). Elsewhere (CPU, no Triton,
fp8 below sm_89) it is the reference.
"""
from __future__ import annotations

import torch

from nanocore.kernels.device import converts_fp8
from nanocore.toolkit.capability import triton_reason
from nanocore.toolkit.numerics import (
    _MIN_SCALE,
    FP8_DTYPE,
    FP8_MAX,
    INT8_MAX,
    quantize_fp8_per_row,
    quantize_int8_per_row,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch reference serves
    triton = None

_QMAX = {torch.int8: INT8_MAX, FP8_DTYPE: FP8_MAX}
#: float32 ``1 / qmax`` (exact as a Python float): what torch multiplies by when a CUDA tensor is divided by a number
RECIPROCAL_QMAX = {dtype: float(torch.tensor(1.0) / torch.tensor(qmax)) for dtype, qmax in _QMAX.items()}
_REFERENCE = {torch.int8: quantize_int8_per_row, FP8_DTYPE: quantize_fp8_per_row}
_BLOCK_MAX = 4096  # elements per loop step: K = 3584 rows are one step, 18944 five

if triton is not None:
    @triton.jit
    def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, QMAX: tl.constexpr,
                                RCP_QMAX: tl.constexpr, IS_INT: tl.constexpr, MIN_SCALE: tl.constexpr,
                                BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_xm
        q_row = q_ptr + row * stride_qm
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):  # NaN kept per lane (max / min drop it by default)
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x), propagate_nan=tl.PropagateNan.ALL)
        scale = tl.maximum(tl.max(amax, axis=0) * RCP_QMAX, MIN_SCALE)  # torch's bits on a GPU (see the docstring)
        scale = tl.where(tl.max((amax != amax).to(tl.int32), axis=0) > 0, float("nan"), scale)  # as torch's amax
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            y = tl.div_rn(tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32), scale)
            y = tl.minimum(tl.maximum(y, -QMAX, propagate_nan=tl.PropagateNan.ALL), QMAX,
                           propagate_nan=tl.PropagateNan.ALL)
            if IS_INT:
                y = (y + 12582912.0) - 12582912.0  # + 1.5 * 2^23 rounds |y| < 2^22 to nearest even, as torch.round
            else:
                y = _round_to_e4m3(y)
            tl.store(q_row + offs, y.to(q_ptr.dtype.element_ty), mask=offs < K)

    @triton.jit
    def _round_to_e4m3(y):
        """``y`` rounded to nearest even on the e4m3 grid, in float32, so the conversion that follows is exact (the
        Triton interpreter's own float32 -> e4m3 conversion rounds some values wrongly; on a GPU this costs a few
        ALU ops in a memory-bound kernel). Adding ``1.5 * 2^(e + 20)`` leaves 3 mantissa bits of a value of
        exponent ``e`` (at least -6: e4m3's subnormals share 2^-6's spacing); the sign is put back after."""
        bits = y.to(tl.int32, bitcast=True)
        exponent = tl.maximum((bits >> 23) & 0xFF, 127 - 6)
        magic = (((exponent + 20) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
        rounded = (tl.abs(y) + magic) - magic
        return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


def quantize_per_token_triton(x2: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel on any device Triton runs on (a GPU, or the CPU under ``TRITON_INTERPRET=1``; fp8 needs
    sm_89+ on a GPU). ``quantize_per_token`` picks it where it can run."""
    _check(x2, dtype)
    return _launch(x2, dtype)


def _launch(x2: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    q = torch.empty((m, k), dtype=dtype, device=x2.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x2.device)
    if m:
        block = min(triton.next_power_of_2(k), _BLOCK_MAX)
        _per_token_quant_kernel[(m,)](x2, q, scale, k, x2.stride(0), q.stride(0), QMAX=_QMAX[dtype],
                                      RCP_QMAX=RECIPROCAL_QMAX[dtype], IS_INT=dtype == torch.int8,
                                      MIN_SCALE=_MIN_SCALE, BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return q, scale


def quantize_per_token(x2: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``dtype`` (``torch.int8`` or ``torch.float8_e4m3fn``) rows of ``x2 [M, K]`` and float32 scales ``[M, 1]``:
    the Triton kernel on a GPU that runs Triton, the ``toolkit.numerics`` reference elsewhere."""
    _check(x2, dtype)
    if x2.is_cuda and triton is not None and triton_reason(x2.device, "per-token quantization") is None and (
            dtype == torch.int8 or converts_fp8(x2.device)):
        return _launch(x2, dtype)
    return _REFERENCE[dtype](x2)


def _check(x2: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype not in _QMAX:
        raise ValueError(f"per-token quantization makes torch.int8 or torch.float8_e4m3fn rows, not {dtype}")
    if x2.dim() != 2 or not x2.is_floating_point() or x2.shape[1] == 0:
        raise ValueError(f"per-token quantization takes a floating-point [M, K] tensor with K > 0, got "
                         f"{tuple(x2.shape)} {x2.dtype}; reshape the activations to rows first "
                         f"(toolkit.gemm.gemm_input_rows)")
