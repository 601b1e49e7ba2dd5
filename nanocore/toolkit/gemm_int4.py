"""Mixed-input tensor-core GEMM for int4 weights with group scales and zeros, in the AutoAWQ GEMM layout.

``qweight`` int32 ``[K, N/8]`` (8 int4 per int32 in AWQ's interleaved order), ``qzeros`` int32 ``[K/g, N/8]``,
``scales [K/g, N]``: ``W^T[k, n] = (q[k, n] - z[k//g, n]) * s[k//g, n]`` (``numerics.awq_dequantize``; GPTQ and
compressed-tensors int4 are repacked to it at load by the ``wna16`` method). Each int32 is loaded once and unpacked
into its 8 columns in registers; a nibble OR-ed into the exponent bits of 2^23 is the float ``2^23 + q``, so
dequantizing is one subtraction of ``2^23 + z`` (exact) and one multiply by the group's scale, no int-to-float
conversion. A K tile lies inside one group, so zeros and scales are loaded once per tile.

:func:`awq_mma_linear` (``kind="mma"``): tensor-core tiles, the widened tile the dot's first operand with
``swap_ab``; :func:`awq_dequantize_gpu` (``kind="dequant"``): the whole ``W^T`` in the activation dtype for one
call, then the library GEMM.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.splitk import grouped_tile
except ImportError:  # CPU-only installs use the torch reference
    triton = None


def awq_group_size(qweight: torch.Tensor, scales: torch.Tensor) -> int:
    return qweight.shape[0] // scales.shape[0]


def awq_mma_linear(x2: torch.Tensor, qweight, qzeros, scales, bias, y: torch.Tensor, cfg) -> None:
    """``x2 [M, K]`` times the AWQ weight into ``y [M, N]``; ``cfg`` a ``GemmConfig`` (``block_k`` is cut to the
    group size: it must divide it)."""
    (m, k), n = x2.shape, scales.shape[1]
    group_size = awq_group_size(qweight, scales)
    block_k = min(cfg.block_k, group_size)
    if group_size % block_k:
        raise ValueError(f"awq: block_k {block_k} must divide the group size {group_size}")
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), )
    _awq_mma_kernel[grid](
        x2, qweight, qzeros, scales, bias if bias is not None else scales, y, m, n, k, x2.stride(0),
        qweight.stride(0), qzeros.stride(0), scales.stride(0), y.stride(0), HAS_BIAS=bias is not None,
        GROUP_SIZE=group_size, SWAP_AB=cfg.swap_ab, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
        GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def awq_dequantize_gpu(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """``W^T [K, N]`` in ``dtype`` (the reference's values: ``(q - z) * s`` rounded once), one Triton pass."""
    k, n = qweight.shape[0], scales.shape[1]
    out = torch.empty((k, n), dtype=dtype, device=qweight.device)
    block_k, block_n = 32, 256
    _awq_dequant_kernel[(triton.cdiv(k, block_k), triton.cdiv(n, block_n))](
        qweight, qzeros, scales, out, k, n, qweight.stride(0), qzeros.stride(0), scales.stride(0),
        GROUP_SIZE=awq_group_size(qweight, scales), BLOCK_K=block_k, BLOCK_N=block_n)
    return out


if triton is not None:
    @triton.jit
    def nibble_shifts():
        """Bit offset of column j in a packed int32 (AutoAWQ puts column [0,2,4,6,1,3,5,7][i] at nibble i)."""
        j = tl.arange(0, 8)
        return ((j // 2) + 4 * (j % 2)) * 4

    @triton.jit
    def magic_float(q):
        """int4 values q (int32) -> float32 ``2^23 + q`` by setting the exponent bits; no cvt instruction."""
        return (q | 0x4B000000).to(tl.float32, bitcast=True)

    @triton.jit
    def awq_group_params(qz_ptr, s_ptr, g, offs_c, N, stride_zk, stride_sk):
        """Zero points (as ``2^23 + z``) and scales of group ``g`` for packed columns ``offs_c``: [BN/8, 8]."""
        mask_c = offs_c < N // 8
        zp = tl.load(qz_ptr + g * stride_zk + offs_c, mask=mask_c, other=0)
        z = magic_float((zp[:, None] >> nibble_shifts()[None, :]) & 0xF)
        offs_n = offs_c[:, None] * 8 + tl.arange(0, 8)[None, :]
        s = tl.load(s_ptr + g * stride_sk + offs_n, mask=mask_c[:, None], other=0.0).to(tl.float32)
        return z, s

    @triton.jit
    def awq_int4_tile(qw_ptr, ks, k_end, offs_c, N, stride_qk):
        """Packed ``[BK, BN/8]`` int32 -> ``2^23 + q`` as float32 ``[BK, BN/8, 8]``; each word is read once."""
        mask = (ks[:, None] < k_end) & (offs_c[None, :] < N // 8)
        packed = tl.load(qw_ptr + ks[:, None] * stride_qk + offs_c[None, :], mask=mask, other=0)
        return magic_float((packed[:, :, None] >> nibble_shifts()[None, None, :]) & 0xF)

    @triton.jit
    def awq_weight_tile(qw_ptr, qz_ptr, s_ptr, k0, offs_k, offs_c, K, N, stride_qk, stride_zk, stride_sk,
                        GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                        dtype: tl.constexpr):
        """The dequantized ``W^T`` tile ``[BK, BN]`` in ``dtype`` (one group: its zeros and scales load once)."""
        z, s = awq_group_params(qz_ptr, s_ptr, k0 // GROUP_SIZE, offs_c, N, stride_zk, stride_sk)
        q = awq_int4_tile(qw_ptr, k0 + offs_k, K, offs_c, N, stride_qk) - z[None, :, :]  # exact small integers
        return tl.reshape(q * s[None, :, :], (BLOCK_K, BLOCK_N)).to(dtype)

    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _awq_mma_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_qk, stride_zk,
                        stride_sk, stride_ym, HAS_BIAS: tl.constexpr, GROUP_SIZE: tl.constexpr,
                        SWAP_AB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_c = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        offs_k = tl.arange(0, BLOCK_K)
        x_rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64) * stride_xm  # clamped: loads need no row mask
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):  # K is a multiple of the group size, which BLOCK_K divides
            w = awq_weight_tile(qw_ptr, qz_ptr, s_ptr, k0, offs_k, offs_c, K, N, stride_qk, stride_zk, stride_sk,
                                GROUP_SIZE, BLOCK_K, BLOCK_N, x_ptr.dtype.element_ty)
            if SWAP_AB:
                x = tl.load(x_ptr + x_rows[None, :] + (k0 + offs_k)[:, None])  # x^T tile [BK, BM]
                acc = tl.dot(tl.trans(w), x, acc)
            else:
                x = tl.load(x_ptr + x_rows[:, None] + (k0 + offs_k)[None, :])
                acc = tl.dot(x, w, acc)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SWAP_AB:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
                     mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))
        else:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _awq_dequant_kernel(qw_ptr, qz_ptr, s_ptr, out_ptr, K, N, stride_qk, stride_zk, stride_sk,
                            GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
        k0 = tl.program_id(0) * BLOCK_K  # BLOCK_K divides the group size (a multiple of 32)
        offs_k = tl.arange(0, BLOCK_K)
        offs_c = tl.program_id(1) * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        w = awq_weight_tile(qw_ptr, qz_ptr, s_ptr, k0, offs_k, offs_c, K, N, stride_qk, stride_zk, stride_sk,
                            GROUP_SIZE, BLOCK_K, BLOCK_N, out_ptr.dtype.element_ty)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = (k0 + offs_k).to(tl.int64) * N
        tl.store(out_ptr + rows[:, None] + offs_n[None, :], w,
                 mask=(offs_n[None, :] < N) & ((k0 + offs_k) < K)[:, None])
