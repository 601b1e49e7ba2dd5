"""Triton GEMMs for weights quantized per output channel (fp8 e4m3 or int8), dequantized in registers.

``y = (x @ Wq^T) * scale + bias`` with ``Wq [N, K]`` and float32 ``scale [N]``. :func:`weight_only_linear` runs the
kernel that ``kernel_plan.KERNEL_PLANS`` names for M (or the one a :class:`GemmConfig` asks for):

* ``gemv`` (M = 1): CUDA-core GEMV in :mod:`nanocore.toolkit.gemv`.
* ``splitk`` (decode and small batches, M <= ``SPLITK_MAX_M``): each program streams ``BLOCK_N`` weight rows over
  one K slice for all tokens, so even N = 3584 keeps every SM busy; the last slice to finish sums the fp32 partials
  (one launch, deterministic). M = 1..2 reduce with FMAs, larger M with ``tl.dot``.
* ``mma`` (larger M): mixed-input tensor-core tiles, :mod:`nanocore.toolkit.gemm_mma`; ``dequant``: the weight
  widened into a transient buffer, then the library GEMM; ``scaled_mm`` (fp8 on sm_89+): activations rounded to
  fp8 per token, fp8 tensor cores (``torch._scaled_mm``).
* ``tiled``: grouped-order tiled GEMM; with int8 activations (``int8_w8a8``) an int8 ``tl.dot``.

fp8 converts natively on sm_89+; elsewhere (and in the Triton interpreter) it is read as uint8 and widened
with integer ops: e4m3 bits shifted into an fp16 are the value / 256, so 256 is folded into the scale.
Launch parameters are a :class:`GemmConfig` (:mod:`nanocore.toolkit.gemm_config`, also importable from here;
``nanocore tune linear`` times several). Torch reference: :func:`weight_only_linear_torch`.
Split-K helpers (``splitk_finish``, ``splitk_workspace``, ...) live in :mod:`nanocore.toolkit.splitk` and are
re-exported here. Used by the fp8, int8 and awq plugins.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from nanocore.kernels.device import converts_fp8, interpreting
from nanocore.toolkit.act_quant import quantize_per_token
from nanocore.toolkit.gemm_config import (  # DECODE_MAX_M and default_config: re-exported, public names here
    DECODE_MAX_M,  # noqa: F401
    SPLITK_MAX_M,
    GemmConfig,
    default_config,  # noqa: F401
    int8_int8_config,
    mma_config,
    weight_only_config,
)
from nanocore.toolkit.gemm_mma import dequantize_channel, launch_mma
from nanocore.toolkit.gemv import launch_gemv
from nanocore.toolkit.splitk import (  # noqa: F401  (public here too)
    _LOCKS,
    W_FP8,
    W_FP8_BITS,
    W_INT8,
    split_k_for,
    splitk_workspace,
)

try:
    import triton
    import triton.language as tl

    from nanocore.toolkit.splitk import grouped_tile, splitk_finish, widen, zero_of  # noqa: F401
except ImportError:  # CPU-only installs use the torch reference
    triton = None

#: ``torch._scaled_mm`` on CUDA needs K and N divisible by 16; other shapes run the mma kernel.
SCALED_MM_ALIGN = 16


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


def check_splitk_rows(m: int) -> None:
    """The split-K kernels hold all M rows in one tile: beyond small batches that tile outgrows shared memory."""
    if m > SPLITK_MAX_M:
        raise ValueError(f"the split-K decode kernel serves M <= {SPLITK_MAX_M} rows, got M={m}: "
                         "use a 'tiled' config (or none: the default picks by M)")


def weight_only_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                       config: GemmConfig | None = None):
    """``x [..., K]`` (fp16/bf16/fp32) times fp8 or int8 ``weight [N, K]`` with ``scale [N]``; the kernel is
    ``config``'s, else the one ``kernel_plan.KERNEL_PLANS`` names for the weight's format at this M."""
    x2, lead = gemm_input_rows(x, weight.shape[1])
    (m, k), n = x2.shape, weight.shape[0]
    if m == 0:
        return torch.empty((*lead, n), dtype=x.dtype, device=x.device)
    fp8 = weight.dtype == torch.float8_e4m3fn
    cfg = config or weight_only_config(m, n, k, "fp8_channel" if fp8 else "int8_channel")
    if cfg.kind == "scaled_mm":
        if fp8 and scaled_mm_fits(x2, weight):
            return fp8_dynamic_linear(x2, weight, scale, bias).reshape(*lead, n)
        cfg = mma_config(m, n, k, "fp8_channel")
    w_kind, w = W_INT8, weight
    if fp8:
        native = converts_fp8(x.device) if cfg.fp8_native is None else cfg.fp8_native
        w_kind, w = (W_FP8, weight) if native else (W_FP8_BITS, weight.view(torch.uint8))
    s = scale.reshape(-1).float()  # a view for the float32 scales the plugins keep: no copy per call
    if w_kind == W_FP8_BITS:
        s = s * 256.0  # the bit trick widens e4m3 to value / 256
    if cfg.kind == "dequant":
        return F.linear(x2, dequantize_channel(w, s, w_kind, x.dtype), bias).reshape(*lead, n)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if cfg.kind == "gemv" and m == 1:
        launch_gemv(x2, w, s, bias, y, w_kind, cfg)
    elif cfg.kind in ("splitk", "gemv"):  # a gemv config at M > 1 runs the split-K kernel with its tiles
        _launch_splitk(x2, w, s, bias, y, w_kind, dataclasses.replace(cfg, kind="splitk", block_m=16))
    elif cfg.kind == "mma":
        launch_mma(x2, w, s, bias, y, w_kind, cfg)
    elif cfg.kind == "tiled":
        launch_tiled(x2, w, s, None, bias, y, w_kind, cfg)
    else:
        raise ValueError(f"weight-only GEMM configs are 'gemv', 'splitk', 'mma', 'tiled', 'dequant' or 'scaled_mm', "
                         f"not {cfg.kind!r}")
    return y.reshape(*lead, n)


def scaled_mm_fits(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    """fp8 tensor cores take this GEMM: sm_89+ (not the interpreter), bf16 activations, K and N multiples of 16."""
    n, k = weight.shape
    return (x2.is_cuda and not interpreting(x2.device) and converts_fp8(x2.device) and x2.dtype == torch.bfloat16
            and hasattr(torch, "_scaled_mm") and k % SCALED_MM_ALIGN == 0 and n % SCALED_MM_ALIGN == 0)


def fp8_dynamic_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8 ``weight [N, K]`` (float32 ``scale [N]``) times ``x2 [M, K]`` rounded to fp8 per token (dynamic scales):
    ``torch._scaled_mm`` on fp8 tensor cores; what ``fp8_w8a8`` computes, for fp8 weights at prefill sizes."""
    xq, x_scale = quantize_per_token(x2, torch.float8_e4m3fn)
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale.contiguous(), scale_b=scale.reshape(1, -1).float(),
                         out_dtype=x2.dtype)
    return y if bias is None else y + bias


def int8_scaled_linear(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None, out_dtype: torch.dtype, config: GemmConfig | None = None):
    """int8 ``xq [M, K]`` (float32 ``x_scale``: one per row, or one for all) times int8 ``weight [N, K]``."""
    (m, k), n = xq.shape, weight.shape[0]
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    cfg = config or int8_int8_config(m, n, k)
    if cfg.kind != "tiled" or cfg.block_m < 16:
        raise ValueError(f"int8 x int8 runs the tiled kernel with block_m >= 16, not {cfg}")
    xs = x_scale.float().reshape(-1).expand(m).contiguous()
    launch_tiled(xq, weight, scale.reshape(-1).float(), xs, bias, y, W_INT8, cfg)
    return y


def _launch_splitk(x2, w, s, bias, y, w_kind, cfg: GemmConfig) -> None:
    (m, k), n = x2.shape, w.shape[0]
    check_splitk_rows(m)
    if m > cfg.block_m and cfg.block_m < 16:
        raise ValueError(f"splitk config block_m={cfg.block_m} is too small for M={m}")
    block_m = max(triton.next_power_of_2(m), 16) if cfg.block_m >= 16 else cfg.block_m
    grid_n, k_tiles = triton.cdiv(n, cfg.block_n), triton.cdiv(k, cfg.block_k)
    split_k = split_k_for(grid_n, k_tiles, x2.device, cfg.split_k)
    k_per_split = triton.cdiv(k_tiles, split_k) * cfg.block_k
    split_k = triton.cdiv(k, k_per_split)
    partials, locks = splitk_workspace(split_k, m, n, grid_n, x2.device, w)
    b = bias if bias is not None else s  # placeholder pointer when there is no bias
    _wo_splitk_kernel[(grid_n, split_k)](
        x2, w, s, b, y, partials if partials is not None else s, locks if locks is not None else s,
        m, n, k, k_per_split, x2.stride(0), w.stride(0), y.stride(0), HAS_BIAS=bias is not None, W_KIND=w_kind,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def launch_tiled(x2, w, s, x_scale, bias, y, w_kind, cfg: GemmConfig) -> None:
    """Tiled GEMM; ``x_scale [M]`` (float32) means ``x2`` is int8 and the dot runs on int8 tensor cores."""
    (m, k), n = x2.shape, w.shape[0]
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), )
    b = bias if bias is not None else s
    _weight_gemm_kernel[grid](x2, w, s, x_scale if x_scale is not None else s, b, y, m, n, k, x2.stride(0),
                              w.stride(0), y.stride(0), HAS_BIAS=bias is not None, A_INT8=x_scale is not None,
                              W_KIND=w_kind, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                              GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


if triton is not None:
    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _wo_splitk_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per_split,
                          stride_xm, stride_wn, stride_ym, HAS_BIAS: tl.constexpr, W_KIND: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          SPLIT_K: tl.constexpr):
        # program (n block, K slice): stream BLOCK_N weight rows of this slice once for all M tokens
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        k_start = tl.program_id(1) * k_per_split
        k_end = tl.minimum(K, k_start + k_per_split)
        w_rows = w_ptr + offs_n[:, None] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            ks = k0 + offs_k
            w = tl.load(w_rows + ks[None, :], mask=(offs_n[:, None] < N) & (ks[None, :] < k_end),
                        other=zero_of(w_ptr))
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < k_end), other=0.0)
            if BLOCK_M >= 16:
                acc = tl.dot(x, tl.trans(widen(w, W_KIND, x.dtype)), acc)
            else:
                wf = widen(w, W_KIND, tl.float32)
                acc += tl.sum(x.to(tl.float32)[:, None, :] * wf[None, :, :], axis=2)
        acc = acc * tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
        splitk_finish(acc, y_ptr, b_ptr, part_ptr, lock_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, SPLIT_K)

    @triton.jit(do_not_specialize=["M"])  # M = tokens of the step: no compile per batch size (masks only)
    def _weight_gemm_kernel(x_ptr, w_ptr, s_ptr, xs_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                            HAS_BIAS: tl.constexpr, A_INT8: tl.constexpr, W_KIND: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr):
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if A_INT8 else tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0)
            w = tl.load(w_ptr + offs_n[None, :] * stride_wn + ks[:, None],
                        mask=(offs_n[None, :] < N) & (ks[:, None] < K), other=zero_of(w_ptr))
            if A_INT8:
                acc = tl.dot(x, w, acc, out_dtype=tl.int32)
            else:
                acc = tl.dot(x, widen(w, W_KIND, x.dtype), acc)
        out = acc.to(tl.float32) * tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
        if A_INT8:
            out = out * tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
        if HAS_BIAS:
            out += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], out.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
