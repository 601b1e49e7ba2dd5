"""Triton W4A16 GEMMs for AutoAWQ GEMM tensors (dequantized in registers) and their torch twin.

``qweight`` int32 ``[K, N/8]`` (8 int4 per int32 in AWQ's interleaved order), ``qzeros`` int32
``[K/g, N/8]``, ``scales`` ``[K/g, N]``: ``W^T[k, n] = (q[k, n] - z[k//g, n]) * s[k//g, n]``. The bf16/fp16
weight is never materialised: a tiled GEMM for prefill and a GEMV-style kernel for decode
(M <= ``DECODE_MAX_M``), both unpacking int4 tiles in registers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nanocore.kernels.quant_gemm import gemm_input_rows
from nanocore.quant_utils import awq_dequantize

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the torch twin
    triton = None

DECODE_MAX_M = 8


def awq_linear_torch(x, qweight, qzeros, scales, bias=None):
    """The torch twin: unpack and dequantize the whole weight, then ``F.linear``."""
    return F.linear(x, awq_dequantize(qweight, qzeros, scales).to(x.dtype).t(), bias)


def awq_linear_triton(x, qweight, qzeros, scales, bias=None):
    """``x [..., K]`` (fp16/bf16/fp32) times the AWQ weight; GEMV for small M, tiled GEMM otherwise."""
    x2, lead = gemm_input_rows(x, qweight.shape[0], "the AWQ weight")
    k = x2.shape[1]
    m, n = x2.shape[0], scales.shape[1]
    group_size = k // scales.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    b = bias if bias is not None else scales
    block_k = min(group_size, 64)  # a K tile never straddles two groups
    common = dict(HAS_BIAS=bias is not None, GROUP_SIZE=group_size)
    if m <= DECODE_MAX_M:
        grid = (triton.cdiv(n, 64), )
        _awq_gemv_kernel[grid](x2, qweight, qzeros, scales, b, y, m, n, k, x2.stride(0), qweight.stride(0),
                               qzeros.stride(0), scales.stride(0), y.stride(0), **common,
                               BLOCK_M=triton.next_power_of_2(m), BLOCK_N=64, BLOCK_K=block_k, num_warps=4)
    else:
        block_m = 32 if m <= 32 else (64 if m <= 64 else 128)
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, 128))
        _awq_gemm_kernel[grid](x2, qweight, qzeros, scales, b, y, m, n, k, x2.stride(0), qweight.stride(0),
                               qzeros.stride(0), scales.stride(0), y.stride(0), **common,
                               BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=block_k, num_warps=8 if block_m == 128 else 4,
                               num_stages=3)
    return y.reshape(*lead, n)


if triton is not None:
    @triton.jit
    def _unpack_tile(packed, offs_n):
        """int32 words (one per column, repeated 8x) -> this column's int4 in AWQ order [0,2,4,6,1,3,5,7]."""
        j = offs_n % 8
        shifts = ((j // 2) + 4 * (j % 2)) * 4
        return (packed >> shifts[None, :]) & 0xF

    @triton.jit
    def _dequant_tile(qw_ptr, qz_ptr, s_ptr, ks, offs_n, N, K, stride_qk, stride_zk, stride_sk,
                      GROUP_SIZE: tl.constexpr):
        """``W^T`` tile [BLOCK_K, BLOCK_N] in fp32; the tile lies inside one group."""
        mask_n = offs_n < N
        mask = (ks[:, None] < K) & mask_n[None, :]
        q = _unpack_tile(tl.load(qw_ptr + ks[:, None] * stride_qk + (offs_n // 8)[None, :], mask=mask, other=0),
                         offs_n)
        g = tl.min(ks, axis=0) // GROUP_SIZE
        z = _unpack_tile(tl.load(qz_ptr + g * stride_zk + (offs_n // 8)[None, :], mask=mask_n[None, :], other=0),
                         offs_n)
        s = tl.load(s_ptr + g * stride_sk + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        return (q - z).to(tl.float32) * s[None, :]

    @triton.jit
    def _awq_gemm_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_qk, stride_zk,
                         stride_sk, stride_ym, HAS_BIAS: tl.constexpr, GROUP_SIZE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
            w = _dequant_tile(qw_ptr, qz_ptr, s_ptr, ks, offs_n, N, K, stride_qk, stride_zk, stride_sk, GROUP_SIZE)
            acc = tl.dot(x, w.to(x.dtype), acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _awq_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_qk, stride_zk,
                         stride_sk, stride_ym, HAS_BIAS: tl.constexpr, GROUP_SIZE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # decode: every program streams its int4 columns once for all M (<= 8) tokens
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0).to(tl.float32)
            w = _dequant_tile(qw_ptr, qz_ptr, s_ptr, ks, offs_n, N, K, stride_qk, stride_zk, stride_sk, GROUP_SIZE)
            acc += tl.sum(x[:, :, None] * w[None, :, :], axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
