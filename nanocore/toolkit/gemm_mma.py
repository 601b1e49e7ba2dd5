"""Mixed-input tensor-core GEMM for one-byte weights per output channel (int8, fp8 e4m3), and the dequantize path.

``y = (x @ Wq^T) * scale + bias`` with ``Wq [N, K]`` row-major as checkpoints store it (no repacking) and float32
``scale [N]``. Each program owns ``BLOCK_N`` weight rows x ``BLOCK_M`` tokens and walks K: the weight tile is loaded
one byte per value (16-byte loads along K, pipelined ``num_stages`` deep), widened in registers and fed to
``tl.dot`` with fp32 accumulation; the per-channel scale and bias are applied once, in the epilogue.

* ``swap_ab`` (default): the widened weight tile is the dot's first operand, ``acc^T[BN, BM] = W[BN, BK] @ x^T``.
  On sm_90 the first wgmma operand may come from registers, so the widened weights never pass through shared
  memory (the second operand, the activations, is read from it as loaded).
* ``fast_widen``: int8 bytes (a uint8 view) XOR ``0x4B000080`` are the float ``2^23 + b + 128``: one XOR and one
  subtraction instead of an int-to-float conversion (a quarter-rate instruction on the CUDA cores).

:func:`dequantize_channel` widens the whole weight into a buffer of the activation dtype (``kind="dequant"``:
large prefill chunks, the library GEMM; the buffer lives for one call). Torch reference:
:func:`nanocore.toolkit.gemm.weight_only_linear_torch`.
"""
from __future__ import annotations

import torch

from nanocore.toolkit.splitk import W_INT8

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.splitk import e4m3_bits_to_fp16, grouped_tile, zero_of
except ImportError:  # CPU-only installs use the torch reference
    triton = None

#: Weight encoding of int8 read as uint8 bytes and widened by the exponent trick.
W_INT8_MAGIC = 3
#: ``2^23 + 128``: what the exponent trick adds to every int8 weight.
INT8_MAGIC = 8388736.0


def mma_weight_kind(w: torch.Tensor, w_kind: int, fast_widen: bool) -> tuple[torch.Tensor, int]:
    """The tensor and encoding the mma kernel reads: int8 as uint8 bytes for the exponent trick."""
    if w_kind == W_INT8 and fast_widen:
        return w.view(torch.uint8), W_INT8_MAGIC
    return w, w_kind


def launch_mma(x2, w, s, bias, y, w_kind: int, cfg) -> None:
    """``x2 [M, K]`` times one-byte ``w [N, K]`` (encoding ``w_kind`` of ``toolkit.splitk``) with float32 scales
    ``s [N]`` (times 256 for fp8 bits) into ``y [M, N]``; ``cfg`` a ``GemmConfig`` of kind ``mma``."""
    (m, k), n = x2.shape, w.shape[0]
    w, w_kind = mma_weight_kind(w, w_kind, cfg.fast_widen)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), )
    _mma_channel_kernel[grid](
        x2, w, s, bias if bias is not None else s, y, m, n, k, x2.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, W_KIND=w_kind, SWAP_AB=cfg.swap_ab, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)


def dequantize_channel(w: torch.Tensor, s: torch.Tensor, w_kind: int, dtype: torch.dtype) -> torch.Tensor:
    """``(Wq * s[:, None])`` as ``dtype`` ``[N, K]``, rounded once (as the torch reference rounds it)."""
    n, k = w.shape
    w, w_kind = mma_weight_kind(w, w_kind, True)
    out = torch.empty((n, k), dtype=dtype, device=w.device)
    block_n, block_k = 16, 256
    _dequant_channel_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        w, s, out, n, k, w.stride(0), W_KIND=w_kind, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


if triton is not None:
    @triton.jit
    def widen_weight_tile(w, W_KIND: tl.constexpr, dtype: tl.constexpr):
        """Stored one-byte weights -> ``dtype``: int8, native fp8, fp8 bits (value / 256), int8 bytes by the trick."""
        if W_KIND == 3:
            f = (w.to(tl.int32) ^ 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
            return f.to(dtype)
        elif W_KIND == 2:
            return e4m3_bits_to_fp16(w).to(dtype)
        return w.to(dtype)

    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _mma_channel_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                            HAS_BIAS: tl.constexpr, W_KIND: tl.constexpr, SWAP_AB: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        x_rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64) * stride_xm  # clamped: loads need no row mask
        w_rows = tl.where(offs_n < N, offs_n, 0).to(tl.int64) * stride_wn
        w_ptrs = w_ptr + w_rows[:, None] + offs_k[None, :]
        if SWAP_AB:
            x_ptrs = x_ptr + x_rows[None, :] + offs_k[:, None]  # x^T tile [BK, BM]
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            x_ptrs = x_ptr + x_rows[:, None] + offs_k[None, :]
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_ptrs)
                x = tl.load(x_ptrs)
            else:
                w = tl.load(w_ptrs, mask=(k0 + offs_k)[None, :] < K, other=zero_of(w_ptr))
                k_ok = (k0 + offs_k)[:, None] < K if SWAP_AB else (k0 + offs_k)[None, :] < K
                x = tl.load(x_ptrs, mask=k_ok, other=0.0)
            a = widen_weight_tile(w, W_KIND, x.dtype)
            if SWAP_AB:
                acc = tl.dot(a, x, acc)
            else:
                acc = tl.dot(x, tl.trans(a), acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        s = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)
        if SWAP_AB:
            out = acc * s[:, None]
            if HAS_BIAS:
                out += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], out.to(y_ptr.dtype.element_ty),
                     mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))
        else:
            out = acc * s[None, :]
            if HAS_BIAS:
                out += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], out.to(y_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def _dequant_channel_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_wn, W_KIND: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :], mask=mask,
                    other=zero_of(w_ptr))
        s = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)
        out = widen_weight_tile(w, W_KIND, tl.float32) * s[:, None]
        tl.store(out_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=mask)
