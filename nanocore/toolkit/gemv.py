"""Decode GEMV for one-byte weights (int8, fp8 e4m3) on the CUDA cores: ``y = x @ (Wq * scale)^T`` for M = 1.

At M = 1 a tensor-core dot wastes 15 of 16 rows and moves every dequantized tile through shared memory; this
kernel keeps the weight tile in registers: each thread reads 16 contiguous bytes of a row (``[N, K]`` row-major,
as the checkpoint stores it: no repacking), widens them to fp32 and multiply-adds into a ``[BLOCK_N, BLOCK_K]``
accumulator that is reduced across threads once, after the K loop (``REDUCE_LATE``), or each tile.

int8 widens with the exponent trick: ``(b ^ 0x80) | 0x4B000000`` is the float ``2^23 + b + 128`` (one LOP3 and an
add, no int-to-float conversion, which runs at a quarter of the FMA rate). On a GPU it takes one byte permute
(``prmt``) per weight instead: byte ``b ^ 0x80`` placed in mantissa bits 8-15 of 1.0f is ``1 + (b + 128) * 2^-15``,
four weights per XOR, no add. The offset leaves inside the FMA: ``fma(v, x, -(x + x / 256))`` is ``x * b * 2^-15``
rounded once (``x + x / 256`` is exact for bf16 / fp16 activations), so no large sum is ever cancelled; the
dot is scaled by 2^15 at the end. K slices are summed by
:func:`nanocore.toolkit.splitk.splitk_finish` (the last slice to arrive adds the others' fp32 partials).
Torch reference: :func:`nanocore.toolkit.gemm.weight_only_linear_torch`.
"""
from __future__ import annotations

import torch

from nanocore.kernels.device import interpreting, sm_count
from nanocore.toolkit.splitk import splitk_workspace

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.splitk import e4m3_bits_to_fp16, splitk_finish
except ImportError:  # CPU-only installs use the torch reference
    triton = None

#: Weight encodings: int8 via the exponent trick, fp8 converted natively, fp8 bits widened with integer ops,
#: int8 through the plain int-to-float conversion (kept to compare in the tuning sweep), int8 as offset floats by
#: byte permutes (GPU only: inline PTX).
W_INT8, W_FP8, W_FP8_BITS, W_INT8_CVT, W_INT8_PRMT = 0, 1, 2, 3, 4
#: ``2^23 + 128``: what the int8 exponent trick adds to every weight.
_INT8_MAGIC = 8388736.0


def gemv_split_k(n_blocks: int, k_tiles: int, sms: int, requested: int = 0) -> int:
    """K slices: enough programs for ~4 waves of resident programs per SM, each slice at least two tiles long."""
    if requested:
        return max(1, min(requested, k_tiles))
    want = -(-4 * sms // n_blocks)
    return max(1, min(want, k_tiles // 2, 16))


def launch_gemv(x2, w, s, bias, y, w_kind: int, cfg) -> None:
    """``x2 [1, K]`` times ``w [N, K]`` (one byte per weight, ``w_kind`` as in ``toolkit.gemm``) into ``y [1, N]``;
    ``cfg`` a ``GemmConfig``; ``s`` the float32 scales (times 256 for fp8 bits)."""
    k, n = x2.shape[1], w.shape[0]
    if w_kind == W_INT8 and not cfg.int8_magic:
        w_kind = W_INT8_CVT
    elif w_kind == W_INT8:
        w = w.view(torch.uint8)  # zero-extended bytes: the exponent trick needs no sign extension or mask
        if cfg.int8_prmt and not interpreting(x2.device):  # inline PTX needs a real GPU
            w_kind = W_INT8_PRMT
    elif w_kind == W_FP8:
        w = w.view(torch.uint8)  # a masked tail load needs an integer 'other' (Triton cannot cast 0 to fp8)
    grid_n, k_tiles = triton.cdiv(n, cfg.block_n), triton.cdiv(k, cfg.block_k)
    split_k = gemv_split_k(grid_n, k_tiles, sm_count(x2.device), cfg.split_k)
    k_per_split = triton.cdiv(k_tiles, split_k) * cfg.block_k
    split_k = triton.cdiv(k, k_per_split)
    partials, locks = splitk_workspace(split_k, 1, n, grid_n, x2.device, w)
    placeholder = s
    _gemv_kernel[(grid_n, split_k)](
        x2, w, s, bias if bias is not None else placeholder, y,
        partials if partials is not None else placeholder, locks if locks is not None else placeholder,
        n, k, k_per_split, w.stride(0), HAS_BIAS=bias is not None, W_KIND=w_kind,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split_k, EVEN_K=k % cfg.block_k == 0,
        REDUCE_LATE=cfg.reduce_late, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


if triton is not None:
    @triton.jit
    def widen_byte_weights(w, W_KIND: tl.constexpr):
        """Stored one-byte weights -> fp32 (fp8 bits come out as value / 256: fold 256 into the scale; W_KIND 4 gives
        ``1 + (b + 128) * 2^-15``, the caller removes the offset as ``_gemv_kernel`` does)."""
        if W_KIND == 0:  # one LOP3 plus an add; exact for every int8 (int8 or its uint8 view)
            f = (((w.to(tl.int32) & 0xFF) ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True)
            return f - 8388736.0
        elif W_KIND == 2:
            return e4m3_bits_to_fp16(w).to(tl.float32)
        elif W_KIND == 1:  # fp8 e4m3 bytes (a uint8 view), converted by the hardware
            return w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        elif W_KIND == 4:  # uint8 view -> 1 + (b + 128) * 2^-15: the caller removes the offset (see module doc)
            return tl.inline_asm_elementwise(
                asm="""{
                .reg .b32 t, one;
                xor.b32 t, $4, 0x80808080;
                mov.b32 one, 0x3F800000;
                prmt.b32 $0, t, one, 0x7604;
                prmt.b32 $1, t, one, 0x7614;
                prmt.b32 $2, t, one, 0x7624;
                prmt.b32 $3, t, one, 0x7634;
                }""",
                constraints="=r,=r,=r,=r,r", args=[w], dtype=tl.float32, is_pure=True, pack=4)
        else:
            return w.to(tl.float32)

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, lock_ptr, N, K, k_per_split, stride_wn,
                     HAS_BIAS: tl.constexpr, W_KIND: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, REDUCE_LATE: tl.constexpr):
        # program (n block, K slice): BLOCK_N weight rows of one K slice, read once with 16-byte loads
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        row_ok = offs_n < N
        w_rows = w_ptr + tl.where(row_ok, offs_n, 0)[:, None].to(tl.int64) * stride_wn  # clamped: no row mask
        k_start = tl.program_id(1) * k_per_split
        k_end = tl.minimum(K, k_start + k_per_split)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc = tl.zeros((BLOCK_N, ), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            ks = k0 + offs_k
            if EVEN_K:  # whole tiles: unmasked, so the loads vectorize to 16 bytes
                w = tl.load(w_rows + ks[None, :], eviction_policy="evict_first")
                x = tl.load(x_ptr + ks).to(tl.float32)
            else:
                w = tl.load(w_rows + ks[None, :], mask=ks[None, :] < k_end, other=0,
                            eviction_policy="evict_first")
                x = tl.load(x_ptr + ks, mask=ks < k_end, other=0.0).to(tl.float32)
            if W_KIND == 4:  # x * (1 + u * 2^-15) - x * (1 + 2^-8) = x * b * 2^-15, one rounding (see module doc)
                prod = tl.fma(widen_byte_weights(w, W_KIND), x[None, :], -(x + x * 0.00390625)[None, :])
            else:
                prod = widen_byte_weights(w, W_KIND) * x[None, :]
            if REDUCE_LATE:
                acc2 += prod
            else:
                acc += tl.sum(prod, axis=1)
        if REDUCE_LATE:
            acc = tl.sum(acc2, axis=1)
        if W_KIND == 4:
            acc = acc * 32768.0
        acc = acc * tl.load(s_ptr + offs_n, mask=row_ok, other=0.0)
        offs_m = tl.arange(0, 1)
        splitk_finish(tl.reshape(acc, (1, BLOCK_N)), y_ptr, b_ptr, part_ptr, lock_ptr, offs_m, offs_n, 1, N, N,
                      HAS_BIAS, SPLIT_K)
