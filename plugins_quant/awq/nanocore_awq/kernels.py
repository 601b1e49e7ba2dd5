"""W4A16 GEMMs for AutoAWQ GEMM tensors (dequantized in registers), the kernel choice per M, and their torch twin.

``qweight`` int32 ``[K, N/8]`` (8 int4 per int32 in AWQ's interleaved order), ``qzeros`` int32
``[K/g, N/8]``, ``scales`` ``[K/g, N]``: ``W^T[k, n] = (q[k, n] - z[k//g, n]) * s[k//g, n]``. The kernel for M is
the ``int4_group`` row of ``toolkit.kernel_plan.KERNEL_PLANS``: the CUDA C++ GEMV (``gemv_cuda``), the split-K
kernel below (one row tile for every token; ``toolkit.splitk.splitk_finish`` sums the K slices), the toolkit's
tensor-core ``mma`` kernel (``toolkit.gemm_int4``), or ``dequant`` (the weight widened for one call, then the library
GEMM). Launch parameters are a core ``GemmConfig``; the int4 unpacking helpers are the toolkit's.
"""
from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F

from nanocore.toolkit.capability import kernel_uses_triton
from nanocore.toolkit.gemm import (
    GemmConfig,
    check_splitk_rows,
    gemm_input_rows,
    split_k_for,
    splitk_workspace,
)
from nanocore.toolkit.gemm_config import weight_only_config
from nanocore.toolkit.gemm_int4 import awq_dequantize_gpu, awq_mma_linear
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, kernel_for
from nanocore.toolkit.numerics import awq_dequantize
from nanocore_awq.gemv_cuda import awq_gemv_cuda, gemv_fits, gemv_reason

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.gemm_int4 import awq_group_params, awq_int4_tile
    from nanocore.toolkit.splitk import splitk_finish
except ImportError:  # CPU-only installs use the torch twin
    triton = None

__all__ = ["AWQ_PLAN", "awq_default_config", "awq_linear_gpu", "awq_linear_torch", "awq_linear_triton",
           "run_awq_kernel"]
#: Which kernel runs at each M (the toolkit's table, stated once for every int4 method).
AWQ_PLAN = KERNEL_PLANS["int4_group"]
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
    if kernel_for(AWQ_PLAN, x2.shape[0]) == "cuda_gemv" and gemv_fits(x2.shape[0], x2, qweight, qzeros, scales, bias):
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
    """The config of the kernel ``AWQ_PLAN`` names for ``m`` (the split-K tiles where it names the CUDA GEMV)."""
    kernel = kernel_for(AWQ_PLAN, m)
    if kernel in ("cuda_gemv", "splitk"):
        if m == 1:
            return GemmConfig("splitk", block_m=1, block_n=128, block_k=128, num_warps=4)
        return GemmConfig("splitk", block_m=16, block_n=64, block_k=128, num_warps=4)
    return weight_only_config(m, n, k, "int4_group")


def awq_linear_triton(x, qweight, qzeros, scales, bias=None, config: GemmConfig | None = None):
    """``x [..., K]`` (fp16/bf16/fp32) times the AWQ weight; split-K GEMV for small M, tiled GEMM otherwise."""
    x2, lead = gemm_input_rows(x, qweight.shape[0], "the AWQ weight")
    (m, k), n = x2.shape, scales.shape[1]
    group_size = k // scales.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    cfg = config or awq_default_config(m, n, k)
    if cfg.kind == "dequant":
        w_t = awq_dequantize_gpu(qweight, qzeros, scales, x.dtype)  # lives for this call only
        return F.linear(x2, w_t.t(), bias).reshape(*lead, n)
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
    elif cfg.kind in ("mma", "tiled"):  # tiled: the same tiles with the activations as the first operand
        awq_mma_linear(x2, qweight, qzeros, scales, bias, y, cfg if cfg.kind == "mma" else
                       dataclasses.replace(cfg, swap_ab=False))
    else:
        raise ValueError(f"awq configs are 'splitk', 'mma', 'tiled' or 'dequant', not {cfg.kind!r}")
    return y.reshape(*lead, n)


if triton is not None:
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
            z, s = awq_group_params(qz_ptr, s_ptr, k0 // GROUP_SIZE, offs_c, N, stride_zk, stride_sk)
            q = awq_int4_tile(qw_ptr, ks, k_end, offs_c, N, stride_qk) - z[None, :, :]  # exact small integers
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
