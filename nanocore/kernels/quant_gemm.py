"""Triton GEMMs for weights quantized per output channel (fp8 e4m3 or int8), dequantized in registers.

``y = (x @ Wq^T) * scale + bias`` with ``Wq [N, K]`` and float32 ``scale [N]``: a tiled GEMM, and a
GEMV-style kernel for decode (M <= ``DECODE_MAX_M``) that streams each weight row once for all tokens.
fp8 is read as uint8 and widened with integer ops (no fp8 hardware needed, and the Triton interpreter
runs it): e4m3 bits shifted into an fp16 are the value / 256, so 256 is folded into the scale.
Torch reference: :func:`weight_only_linear_torch`. Used by the fp8 and int8 plugins.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the torch reference
    triton = None

#: M at or below which the GEMV-style decode kernel runs instead of the tiled GEMM.
DECODE_MAX_M = 8


def weight_only_linear_torch(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The torch reference: dequantize the weight, then ``F.linear``."""
    w = (weight.float() * scale.float().view(-1, 1)).to(x.dtype)
    return F.linear(x, w, bias)


def gemm_input_rows(x: torch.Tensor, expected_k: int, what: str = "the weight") -> tuple[torch.Tensor, tuple]:
    """``x [..., K]`` as unit-stride rows ``[M, K]`` plus the leading shape; a wrong K is a clear error."""
    lead, k = x.shape[:-1], x.shape[-1]
    if k != expected_k:
        raise ValueError(f"input has {k} features, {what} expects {expected_k}")
    x2 = x.reshape(-1, k)
    return (x2 if x2.stride(-1) == 1 else x2.contiguous()), tuple(lead)


def weight_only_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
    """``x [..., K]`` (fp16/bf16/fp32) times fp8 or int8 ``weight [N, K]`` with ``scale [N]``; GEMV for small M."""
    x2, lead = gemm_input_rows(x, weight.shape[1])
    (m, k), n = x2.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    w_fp8 = weight.dtype == torch.float8_e4m3fn
    w_bits = weight.view(torch.uint8) if w_fp8 else weight
    s = scale.reshape(-1).float()
    b = bias if bias is not None else s  # placeholder pointer when there is no bias
    if m <= DECODE_MAX_M:
        block_m = triton.next_power_of_2(m)
        grid = (triton.cdiv(n, 32), )
        _weight_gemv_kernel[grid](x2, w_bits, s, b, y, m, n, k, x2.stride(0), w_bits.stride(0), y.stride(0),
                               HAS_BIAS=bias is not None, W_FP8=w_fp8, BLOCK_M=block_m, BLOCK_N=32,
                               BLOCK_K=128 if block_m <= 2 else 64, num_warps=4)
    else:
        block_m = 32 if m <= 32 else (64 if m <= 64 else 128)
        block_n, block_k = (128, 64) if block_m == 128 else (64, 128)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), )
        _weight_gemm_kernel[grid](x2, w_bits, s, b, y, m, n, k, x2.stride(0), w_bits.stride(0), y.stride(0),
                               HAS_BIAS=bias is not None, W_FP8=w_fp8, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                               GROUP_M=8, num_warps=8 if block_m == 128 else 4, num_stages=3)
    return y.reshape(*lead, n)


if triton is not None:
    @triton.jit
    def _e4m3_bits_to_fp16(bits):
        """fp8 e4m3 bit patterns (uint8) -> fp16 holding value / 256 (exact, subnormals included)."""
        b = bits.to(tl.int16)
        h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
        return h.to(tl.float16, bitcast=True)

    @triton.jit
    def _widen(w, W_FP8: tl.constexpr):
        """Stored weights -> fp16: fp8 bit patterns (value / 256), or int8 values (exact)."""
        if W_FP8:
            return _e4m3_bits_to_fp16(w)
        return w.to(tl.float16)

    @triton.jit
    def _weight_gemm_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                         HAS_BIAS: tl.constexpr, W_FP8: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        # grouped launch order: neighbouring programs share weight tiles in L2
        group = pid // (GROUP_M * grid_n)
        first_m = group * GROUP_M
        size_m = min(grid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * grid_n)) % size_m
        pid_n = (pid % (GROUP_M * grid_n)) // size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
            bits = tl.load(w_ptr + offs_n[None, :] * stride_wn + ks[:, None],
                           mask=(offs_n[None, :] < N) & (ks[:, None] < K), other=0)
            acc = tl.dot(x, _widen(bits, W_FP8).to(x.dtype), acc)
        scale = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0) * (256.0 if W_FP8 else 1.0)
        acc = acc * scale[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _weight_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                         HAS_BIAS: tl.constexpr, W_FP8: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # decode: every program streams BLOCK_N weight rows once for all M (<= 8) tokens
        pid_n = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0).to(tl.float32)
            bits = tl.load(w_ptr + offs_n[:, None] * stride_wn + ks[None, :],
                           mask=(offs_n[:, None] < N) & (ks[None, :] < K), other=0)
            w = _widen(bits, W_FP8).to(tl.float32)
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        scale = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0) * (256.0 if W_FP8 else 1.0)
        acc = acc * scale[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
