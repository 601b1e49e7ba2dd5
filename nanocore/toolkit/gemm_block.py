"""Triton GEMM for one-byte weights (fp8 e4m3, int8) with one scale per tile of ``block = (rows, columns)``.

``y = x @ (Wq * S)^T + bias`` where ``S[n, k] = scale[n // block[0], k // block[1]]``: DeepSeek-V3 / llm-compressor
``FP8_BLOCK`` checkpoints store ``scale [ceil(N/128), ceil(K/128)]``; a layer whose merged shards or TP slices do not
start on a 128-row boundary keeps one scale row per weight row instead (``block = (1, 128)``,
:func:`expand_block_rows`). The weights stay one byte each (no float copy).

The kernel applies the scale inside the K loop: ``BLOCK_K`` divides ``block[1]``, so every K tile lies in one scale
column and ``acc += dot(x_tile, Wq_tile) * scale[n_block, k_block]`` (fp32, per output column) is exactly
``x @ (Wq * S)^T`` summed in another order. One kernel serves decode (``M <= DECODE_MAX_M``: one row tile, K split
over programs, partials summed by :func:`nanocore.toolkit.gemm.splitk_finish`) and prefill (grouped row and column
tiles, no split). fp8 widens as in :mod:`nanocore.toolkit.gemm` (native on sm_89+, else bits with 256 folded in).
Torch reference: :func:`block_scaled_linear_torch` (dequantize blockwise, then ``F.linear``).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from nanocore.kernels.device import converts_fp8
from nanocore.toolkit.gemm import (
    DECODE_MAX_M,
    W_FP8,
    W_FP8_BITS,
    W_INT8,
    GemmConfig,
    default_config,
    gemm_input_rows,
    split_k_for,
    splitk_workspace,
)
from nanocore.toolkit.numerics import expand_block_rows, expand_block_scales  # noqa: F401  (public here too)

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.splitk import grouped_tile, splitk_finish, widen, zero_of
except ImportError:  # CPU-only installs use the torch reference
    triton = None

#: Smallest K tile ``tl.dot`` takes: a block's column count must be a multiple of it.
MIN_BLOCK_K = 16


def block_scale_shape(n: int, k: int, block: tuple[int, int]) -> tuple[int, int]:
    """Shape of the scales of an ``[n, k]`` weight in ``block`` tiles: ``(ceil(n / rows), ceil(k / cols))``."""
    return -(-n // block[0]), -(-k // block[1])


def check_block_scales(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], kernel: bool = True) -> None:
    """A clear error when ``scale`` is not the tile grid of ``weight``, or (``kernel``) when ``block`` has a column
    count the Triton kernel cannot tile."""
    n, k = weight.shape
    want = block_scale_shape(n, k, block)
    if tuple(scale.shape) != want:
        raise ValueError(f"block scales of a [{n}, {k}] weight in {tuple(block)} tiles have shape {want}, got "
                         f"{tuple(scale.shape)}; was the checkpoint quantized with another block_structure?")
    if kernel and block[1] % MIN_BLOCK_K:
        raise ValueError(f"block columns {block[1]} are no multiple of {MIN_BLOCK_K}, which the block-scaled GEMM "
                         f"needs; re-quantize with block_structure [128, 128]")


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The float32 weight ``Wq * S`` of a block-scaled ``weight [N, K]``."""
    check_block_scales(weight, scale, block, kernel=False)
    return weight.float() * expand_block_scales(scale, weight.shape, block)


def block_scaled_linear_torch(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                              bias: torch.Tensor | None = None) -> torch.Tensor:
    """The torch reference: dequantize the weight tile by tile, then ``F.linear``."""
    return F.linear(x, dequantize_blocks(weight, scale, block).to(x.dtype), bias)


def block_k_for(block_cols: int, wanted: int) -> int:
    """The largest power-of-two K tile up to ``wanted`` that divides ``block_cols``."""
    tile = min(wanted, block_cols & -block_cols)  # the largest power of two dividing block_cols
    if tile < MIN_BLOCK_K:
        raise ValueError(f"block columns {block_cols} have no power-of-two divisor >= {MIN_BLOCK_K} "
                         f"(needed for the K tile); re-quantize with block_structure [128, 128]")
    return tile


def block_config(m: int, n: int, k: int, block_cols: int, config: GemmConfig | None = None) -> GemmConfig:
    """The launch config for an ``[m, k] x [k, n]`` block-scaled GEMM: ``config`` (or the per-channel default for
    the shape) with ``block_k`` cut to divide ``block_cols``; decode sizes keep split-K, larger M tiles without."""
    # M = 1's default is the CUDA-core GEMV, which has no block variant: take the decode split-K default there
    cfg = config or default_config(max(m, 2) if m <= DECODE_MAX_M else m, n, k)
    kind = "splitk" if m <= DECODE_MAX_M and cfg.kind in ("gemv", "splitk") else "tiled"
    block_m = max(16, triton.next_power_of_2(m)) if kind == "splitk" else max(16, cfg.block_m)
    return dataclasses.replace(cfg, kind=kind, block_m=block_m, block_k=block_k_for(block_cols, cfg.block_k))


def block_scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                        bias: torch.Tensor | None = None, config: GemmConfig | None = None) -> torch.Tensor:
    """``x [..., K]`` (fp16/bf16/fp32) times fp8 or int8 ``weight [N, K]`` scaled per ``block`` tile by float32
    ``scale [ceil(N / block[0]), ceil(K / block[1])]``; ``config`` as :class:`GemmConfig` (``block_k`` is cut to
    divide ``block[1]``; ``kind`` splitk runs at M <= 16 only)."""
    x2, lead = gemm_input_rows(x, weight.shape[1])
    (m, k), n = x2.shape, weight.shape[0]
    check_block_scales(weight, scale, block)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    cfg = block_config(m, n, k, block[1], config)
    w_kind, w = W_INT8, weight
    if weight.dtype == torch.float8_e4m3fn:
        native = converts_fp8(x.device) if cfg.fp8_native is None else cfg.fp8_native
        w_kind, w = (W_FP8, weight) if native else (W_FP8_BITS, weight.view(torch.uint8))
    s = scale if scale.dtype == torch.float32 and scale.stride(1) == 1 else scale.float().contiguous()
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split_k = split_k_for(tiles, k_tiles, x.device, cfg.split_k) if cfg.kind == "splitk" else 1
    k_per_split = triton.cdiv(k_tiles, split_k) * cfg.block_k
    split_k = triton.cdiv(k, k_per_split)
    partials, locks = splitk_workspace(split_k, m, n, tiles, x.device, w)
    b = bias if bias is not None else s  # placeholder pointers where there is no bias / no split
    _block_scaled_kernel[(tiles, split_k)](
        x2, w, s, b, y, partials if partials is not None else s, locks if locks is not None else s,
        m, n, k, k_per_split, x2.stride(0), w.stride(0), s.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, W_KIND=w_kind, SCALE_BN=block[0], SCALE_BK=block[1], BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SPLIT_K=split_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y.reshape(*lead, n)


if triton is not None:
    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _block_scaled_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per_split,
                             stride_xm, stride_wn, stride_sn, stride_ym, HAS_BIAS: tl.constexpr,
                             W_KIND: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr):
        # program (row x column tile, K slice); BLOCK_K divides SCALE_BK: each K tile has one scale per column
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        k_start = tl.program_id(1) * k_per_split
        k_end = tl.minimum(K, k_start + k_per_split)
        s_rows = s_ptr + (tl.where(offs_n < N, offs_n, 0) // SCALE_BN) * stride_sn  # clamped: no mask needed
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < k_end), other=0.0)
            w = tl.load(w_ptr + offs_n[None, :] * stride_wn + ks[:, None],
                        mask=(offs_n[None, :] < N) & (ks[:, None] < k_end), other=zero_of(w_ptr))
            s = tl.load(s_rows + k0 // SCALE_BK)
            acc += tl.dot(x, widen(w, W_KIND, x.dtype)) * s[None, :]
        if W_KIND == 2:
            acc = acc * 256.0  # the bit trick widened e4m3 to value / 256 (exact: a power of two)
        splitk_finish(acc, y_ptr, b_ptr, part_ptr, lock_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, SPLIT_K)
