"""Triton W4A16 GEMMs for AutoAWQ GEMM tensors (dequantized in registers) and their torch twin.

``qweight`` int32 ``[K, N/8]`` (8 int4 per int32 in AWQ's interleaved order), ``qzeros`` int32
``[K/g, N/8]``, ``scales`` ``[K/g, N]``: ``W^T[k, n] = (q[k, n] - z[k//g, n]) * s[k//g, n]``. The bf16/fp16
weight is never materialised. Each loaded int32 is unpacked once into its 8 columns (a ``[.., N/8, 8]``
tile, shifts ``4 * [0, 4, 1, 5, 2, 6, 3, 7]``); a nibble OR-ed into the exponent bits of 2^23 is the float
``2^23 + q``, so dequantizing is one subtraction of ``2^23 + z`` (exact) and no int-to-float conversion.
Decode and small batches (M <= ``SPLITK_MAX_M``) run the split-K kernel (core ``quant_gemm.splitk_finish`` sums the K slices),
prefill a grouped tiled GEMM; launch parameters are a core ``GemmConfig``.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from nanocore.toolkit.capability import kernel_uses_triton
from nanocore.toolkit.gemm import (
    SPLITK_MAX_M,
    GemmConfig,
    check_splitk_rows,
    gemm_input_rows,
    split_k_for,
    splitk_workspace,
)
from nanocore.toolkit.numerics import awq_dequantize
from nanocore_awq.gemv_cuda import awq_gemv_cuda, gemv_fits, gemv_reason

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.gemm import grouped_tile, splitk_finish
except ImportError:  # CPU-only installs use the torch twin
    triton = None

__all__ = ["awq_default_config", "awq_linear_gpu", "awq_linear_torch", "awq_linear_triton",
           "run_awq_kernel"]
_warned: set[str] = set()


def awq_linear_torch(x, qweight, qzeros, scales, bias=None):
    """The torch twin: unpack and dequantize the whole weight, then ``F.linear``."""
    return F.linear(x, awq_dequantize(qweight, qzeros, scales).to(x.dtype).t(), bias)


def run_awq_kernel(kernel: str, name: str, x, qweight, qzeros, scales, bias=None):
    """What the ``kernel`` option picks: ``torch`` (and any CPU tensor) the twin, ``triton`` the Triton kernels,
    ``auto`` / ``cuda`` the CUDA GEMV for M <= 4 and Triton beyond (``cuda``: an error if the GEMV cannot build)."""
    if not kernel_uses_triton(kernel, x.device, name, required=("triton", "cuda")):
        return awq_linear_torch(x, qweight, qzeros, scales, bias)
    if kernel == "triton":
        return awq_linear_triton(x, qweight, qzeros, scales, bias)
    return awq_linear_gpu(x, qweight, qzeros, scales, bias, require_gemv=kernel == "cuda")


def awq_linear_gpu(x, qweight, qzeros, scales, bias=None, require_gemv: bool = False):
    """M <= 4 (fp16 / bf16): the CUDA C++ GEMV (``gemv_cuda``); larger M, float32, or where the GEMV cannot be built
    (warned once; an error with ``require_gemv``): the Triton kernels."""
    x2, lead = gemm_input_rows(x, qweight.shape[0], "the AWQ weight")
    if gemv_fits(x2.shape[0], x2, qweight, qzeros, scales, bias):
        reason = gemv_reason(x.device)
        if reason is None:
            return awq_gemv_cuda(x2, qweight, qzeros, scales, bias).reshape(*lead, scales.shape[1])
        if require_gemv:
            raise RuntimeError(f"awq: kernel='cuda' but {reason}; use kernel='auto' to run the Triton kernels")
        if reason not in _warned:
            _warned.add(reason)
            logging.getLogger("nanocore_awq").warning("awq: decode runs the Triton GEMV: %s", reason)
    return awq_linear_triton(x, qweight, qzeros, scales, bias)


def awq_default_config(m: int, n: int, k: int) -> GemmConfig:
    """The measured-best variant for an ``[m, k]`` input (measured on an H200)."""
    if m == 1:
        return GemmConfig("splitk", block_m=1, block_n=128, block_k=128, num_warps=4)
    if m <= SPLITK_MAX_M:  # one row tile for every token: each int4 word is read once (the tiled GEMM at M = 32
        # left most SMs idle on the 7B o / down projections: batch-32 decode 0.30x bf16)
        return GemmConfig("splitk", block_m=16, block_n=64, block_k=128, num_warps=4)
    if m <= 64:
        return GemmConfig("tiled", block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
    return GemmConfig("tiled", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)


def awq_linear_triton(x, qweight, qzeros, scales, bias=None, config: GemmConfig | None = None):
    """``x [..., K]`` (fp16/bf16/fp32) times the AWQ weight; split-K GEMV for small M, tiled GEMM otherwise."""
    x2, lead = gemm_input_rows(x, qweight.shape[0], "the AWQ weight")
    (m, k), n = x2.shape, scales.shape[1]
    group_size = k // scales.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    cfg = config or awq_default_config(m, n, k)
    block_k = min(cfg.block_k, group_size)
    if group_size % block_k:
        raise ValueError(f"awq: block_k {block_k} must divide the group size {group_size}")
    b = bias if bias is not None else scales  # placeholder pointer when there is no bias
    args = (qweight.stride(0), qzeros.stride(0), scales.stride(0), y.stride(0))
    common = dict(HAS_BIAS=bias is not None, GROUP_SIZE=group_size, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.kind == "splitk":
        check_splitk_rows(m)
        if m > 1 and cfg.block_m < 16:
            raise ValueError(f"awq: splitk block_m={cfg.block_m} serves M=1 only (use block_m=16), M={m}")
        grid_n, k_tiles = triton.cdiv(n, cfg.block_n), triton.cdiv(k, block_k)
        split_k = split_k_for(grid_n, k_tiles, x.device, cfg.split_k)
        k_per_split = triton.cdiv(k_tiles, split_k) * block_k
        split_k = triton.cdiv(k, k_per_split)
        partials, locks = splitk_workspace(split_k, m, n, grid_n, x.device, qweight)
        _awq_splitk_kernel[(grid_n, split_k)](
            x2, qweight, qzeros, scales, b, y, partials if partials is not None else scales,
            locks if locks is not None else scales, m, n, k, k_per_split, x2.stride(0), *args, **common,
            BLOCK_M=1 if cfg.block_m == 1 else max(16, triton.next_power_of_2(m)), SPLIT_K=split_k)
    elif cfg.kind == "tiled":
        grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), )
        _awq_gemm_kernel[grid](x2, qweight, qzeros, scales, b, y, m, n, k, x2.stride(0), *args, **common,
                               BLOCK_M=cfg.block_m, GROUP_M=cfg.group_m)
    else:
        raise ValueError(f"awq configs are 'splitk' or 'tiled', not {cfg.kind!r}")
    return y.reshape(*lead, n)


if triton is not None:
    @triton.jit
    def _nibble_shifts():
        """Bit offset of column j in a packed int32 (AutoAWQ puts column [0,2,4,6,1,3,5,7][i] at nibble i)."""
        j = tl.arange(0, 8)
        return ((j // 2) + 4 * (j % 2)) * 4

    @triton.jit
    def _magic_float(q):
        """int4 values q (int32) -> float32 ``2^23 + q`` by setting the exponent bits; no cvt instruction."""
        return (q | 0x4B000000).to(tl.float32, bitcast=True)

    @triton.jit
    def _group_params(qz_ptr, s_ptr, g, offs_c, N, stride_zk, stride_sk):
        """Zero points (as ``2^23 + z``) and scales of group ``g`` for packed columns ``offs_c``: [BN/8, 8]."""
        mask_c = offs_c < N // 8
        zp = tl.load(qz_ptr + g * stride_zk + offs_c, mask=mask_c, other=0)
        z = _magic_float((zp[:, None] >> _nibble_shifts()[None, :]) & 0xF)
        offs_n = offs_c[:, None] * 8 + tl.arange(0, 8)[None, :]
        s = tl.load(s_ptr + g * stride_sk + offs_n, mask=mask_c[:, None], other=0.0).to(tl.float32)
        return z, s

    @triton.jit
    def _int4_tile(qw_ptr, ks, k_end, offs_c, N, stride_qk):
        """Packed ``[BK, BN/8]`` int32 -> ``2^23 + q`` as float32 ``[BK, BN/8, 8]``; each word is read once."""
        mask = (ks[:, None] < k_end) & (offs_c[None, :] < N // 8)
        packed = tl.load(qw_ptr + ks[:, None] * stride_qk + offs_c[None, :], mask=mask, other=0)
        return _magic_float((packed[:, :, None] >> _nibble_shifts()[None, None, :]) & 0xF)

    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _awq_splitk_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per_split,
                           stride_xm, stride_qk, stride_zk, stride_sk, stride_ym, HAS_BIAS: tl.constexpr,
                           GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
        # program (n block, K slice): its int4 columns of this slice are read once for all M tokens
        offs_c = tl.program_id(0) * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        offs_k = tl.arange(0, BLOCK_K)
        offs_m = tl.arange(0, BLOCK_M)
        k_start = tl.program_id(1) * k_per_split
        k_end = tl.minimum(K, k_start + k_per_split)
        if BLOCK_M == 1:
            acc3 = tl.zeros((BLOCK_N // 8, 8), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):  # a K tile lies inside one group
            ks = k0 + offs_k
            z, s = _group_params(qz_ptr, s_ptr, k0 // GROUP_SIZE, offs_c, N, stride_zk, stride_sk)
            q = _int4_tile(qw_ptr, ks, k_end, offs_c, N, stride_qk) - z[None, :, :]  # exact small integers
            if BLOCK_M == 1:
                x = tl.load(x_ptr + ks, mask=ks < k_end, other=0.0).to(tl.float32)
                acc3 += tl.sum(x[:, None, None] * q, axis=0) * s
            else:
                x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                            mask=(offs_m[:, None] < M) & (ks[None, :] < k_end), other=0.0)
                w = tl.reshape(q * s[None, :, :], (BLOCK_K, BLOCK_N))
                acc = tl.dot(x, w.to(x.dtype), acc)
        if BLOCK_M == 1:
            acc = tl.reshape(acc3, (1, BLOCK_N))
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        splitk_finish(acc, y_ptr, b_ptr, part_ptr, lock_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, SPLIT_K)

    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _awq_gemm_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_qk, stride_zk,
                         stride_sk, stride_ym, HAS_BIAS: tl.constexpr, GROUP_SIZE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_c = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
            z, s = _group_params(qz_ptr, s_ptr, k0 // GROUP_SIZE, offs_c, N, stride_zk, stride_sk)
            q = _int4_tile(qw_ptr, ks, K, offs_c, N, stride_qk) - z[None, :, :]
            w = tl.reshape(q * s[None, :, :], (BLOCK_K, BLOCK_N))
            acc = tl.dot(x, w.to(x.dtype), acc)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
