"""Quantization numerics: rounding references for fp8 e4m3, int8 and AutoAWQ int4, and int4 packing.

Torch references, exact and device-agnostic: kernels are tested against them, and offline ``quantize``
implementations use them directly.
"""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
INT8_MAX = 127.0
INT4_MAX = 15
#: AutoAWQ packs 8 int4 values per int32 in this order (column j of a pack holds value AWQ_ORDER[j]).
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_PACK_FACTOR = 8
_MIN_SCALE = 1e-12  # an all-zero row must not give a zero (then NaN) scale


# ---- symmetric per-row quantization (weights per output channel, activations per token) ----------
def symmetric_scale(x: torch.Tensor, qmax: float, dim: int = -1) -> torch.Tensor:
    """Scale (float32, ``dim`` kept) so that ``x / scale`` fills ``[-qmax, qmax]``."""
    return (x.float().abs().amax(dim=dim, keepdim=True) / qmax).clamp_min(_MIN_SCALE)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def quantize_fp8_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 values and float32 scales ``[rows, 1]`` (weights: per output channel; activations: per token)."""
    scale = symmetric_scale(x, FP8_MAX)
    return quantize_fp8(x, scale), scale


def expand_block_rows(scale: torch.Tensor, rows: int, block_rows: int) -> torch.Tensor:
    """``[ceil(rows / block_rows), C]`` tile scales -> ``[rows, C]``: one scale row per weight row."""
    if scale.shape[0] != -(-rows // block_rows):
        raise ValueError(f"{scale.shape[0]} rows of block scales do not cover {rows} weight rows in tiles of "
                         f"{block_rows}; was the checkpoint quantized with another block_structure?")
    return scale.repeat_interleave(block_rows, dim=0)[:rows]


def expand_block_scales(scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """float32 ``[N, K]``: each tile's scale repeated over its ``block = (rows, cols)`` tile (partial at the edges)."""
    (n, k), (rows, cols) = shape, block
    return expand_block_rows(scale.float(), n, rows).repeat_interleave(cols, dim=1)[:, :k]


def quantize_fp8_blocks(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 values of ``w [N, K]`` and float32 scales ``[ceil(N / rows), ceil(K / cols)]``, one per
    ``block = (rows, cols)`` tile (absmax / 448; partial tiles at the edges), as llm-compressor's FP8_BLOCK writes."""
    (n, k), (rows, cols) = w.shape, block
    padded = torch.nn.functional.pad(w.float().abs(), (0, -k % cols, 0, -n % rows))
    tiles = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols).amax(dim=(1, 3))
    scale = (tiles / FP8_MAX).clamp_min(_MIN_SCALE)
    return quantize_fp8(w, expand_block_scales(scale, (n, k), block)), scale


def quantize_int8_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and float32 scales ``[rows, 1]``."""
    scale = symmetric_scale(x, INT8_MAX)
    return quantize_int8(x, scale), scale


# ---- fp8 weights: scale search and error feedback (offline side of the fp8 methods) ----------------
#: Per-channel scale multipliers tried by the search: an octave above absmax / 448 (the e4m3 grid shifts
#: against the values without clipping) and a few clipping steps below it.
FP8_SCALE_FACTORS = tuple(torch.linspace(0.85, 2.0, 116).tolist())


def quantize_fp8_activations(x2: torch.Tensor, input_scale: torch.Tensor | None = None):
    """fp8 rows of ``x2 [M, K]`` and float32 scales ``[M, 1]``: dynamic per token, or the static per-tensor scale."""
    if input_scale is None:
        return quantize_fp8_per_row(x2)
    scale = input_scale.float().reshape(1, 1).expand(x2.shape[0], 1)
    return quantize_fp8(x2, scale), scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale


def fp8_search_scale(w: torch.Tensor, column_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row scale ``[N, 1]`` minimising the rounding error ``sum_k h_k (w - deq(q(w)))^2``.

    ``column_weight`` ``h [K]`` is the mean squared activation of each input channel (uniform if None),
    so the error is the expected output error of the layer under a diagonal model of its inputs.
    """
    w = w.float()
    h = torch.ones(w.shape[1], device=w.device) if column_weight is None else column_weight.float().clamp_min(0).to(w.device)
    base = symmetric_scale(w, FP8_MAX)
    best_err, best = None, base
    for factor in FP8_SCALE_FACTORS:
        scale = base * factor
        err = ((w - fp8_dequantize(quantize_fp8(w, scale), scale)) ** 2 * h).sum(dim=1, keepdim=True)
        if best_err is None:
            best_err, best = err, scale
        else:
            better = err < best_err
            best_err, best = torch.where(better, err, best_err), torch.where(better, scale, best)
    return best


def fp8_gptq(w: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, damp: float = 0.01,
             block: int = 128) -> torch.Tensor:
    """fp8 values for ``w [N, K]`` with fixed per-row ``scale``, rounding column by column and pushing each
    column's error onto the columns not yet rounded (GPTQ, in activation order) so that ``x @ w.T`` of the
    calibration inputs ``x [T, K]`` changes least. Same format as round-to-nearest, only better values."""
    w = w.float().clone()
    n, k = w.shape
    x = x.float().to(w.device)
    hessian = x.t() @ x / max(x.shape[0], 1)
    dead = hessian.diagonal() == 0
    hessian[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = torch.argsort(hessian.diagonal(), descending=True)
    w, hessian = w[:, order], hessian[order][:, order]
    hessian += torch.eye(k, device=w.device) * damp * hessian.diagonal().mean()
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)
    q = torch.empty(n, k, dtype=FP8_DTYPE, device=w.device)
    for start in range(0, k, block):
        end = min(start + block, k)
        w_blk, err_blk, hinv_blk = w[:, start:end].clone(), torch.zeros(n, end - start, device=w.device), hinv[start:end, start:end]
        for i in range(end - start):
            col = w_blk[:, i:i + 1]
            q_col = quantize_fp8(col, scale)
            err = (col - fp8_dequantize(q_col, scale)) / hinv_blk[i, i]
            w_blk[:, i:] -= err * hinv_blk[i:i + 1, i:]
            err_blk[:, i:i + 1], q[:, start + i:start + i + 1] = err, q_col
        w[:, end:] -= err_blk @ hinv[start:end, end:]
    return q[:, torch.argsort(order)]


def quantize_fp8_weight(w: torch.Tensor, x: torch.Tensor | None = None,
                        scale_method: str = "search") -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 weight ``[N, K]`` + float32 per-channel scale ``[N, 1]`` (the standard fp8 checkpoint layout).

    ``scale_method``: ``absmax`` (absmax / 448, round to nearest) or ``search`` (scale search; with
    calibration inputs ``x [T, K]`` the error is activation weighted and the rounding uses GPTQ).
    """
    if scale_method == "absmax":
        return quantize_fp8_per_row(w)
    if scale_method != "search":
        raise ValueError(f"fp8 scale method must be 'search' or 'absmax', got {scale_method!r}")
    column_weight = None if x is None else (x.float() ** 2).mean(dim=0)
    scale = fp8_search_scale(w, column_weight)
    if x is None:
        return quantize_fp8(w, scale), scale
    return fp8_gptq(w, x, scale), scale


# ---- AutoAWQ int4 (GEMM format) ---------------------------------------------------------------
def pack_int4_awq(q: torch.Tensor) -> torch.Tensor:
    """Pack int4 values ``[R, C]`` (0..15) into int32 ``[R, C / 8]`` in AutoAWQ's interleaved order."""
    rows, cols = q.shape
    if cols % AWQ_PACK_FACTOR:
        raise ValueError(f"int4 packing needs a multiple of {AWQ_PACK_FACTOR} columns, got {cols}")
    q = q.to(torch.int32).reshape(rows, cols // AWQ_PACK_FACTOR, AWQ_PACK_FACTOR)[..., list(AWQ_ORDER)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=q.device)
    return (q << shifts).sum(dim=-1, dtype=torch.int32)


def unpack_int4_awq(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4_awq`: int32 ``[R, C / 8]`` -> int32 values ``[R, C]`` in 0..15."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    q = (packed.unsqueeze(-1) >> shifts) & 0xF
    inverse = [AWQ_ORDER.index(j) for j in range(AWQ_PACK_FACTOR)]
    return q[..., inverse].reshape(packed.shape[0], -1)


def quantize_int4_groups(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric round-to-nearest int4 of ``w [N, K]`` per group of ``group_size`` input channels.

    Returns ``q [N, K]`` (0..15), ``scales [K / g, N]`` and integer ``zeros [K / g, N]`` (AWQ layout).
    """
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"input size {k} is not a multiple of the AWQ group size {group_size}")
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(dim=-1, keepdim=True).clamp_max(0), g.amax(dim=-1, keepdim=True).clamp_min(0)
    scales = ((hi - lo) / INT4_MAX).clamp_min(_MIN_SCALE)
    zeros = (-lo / scales).round().clamp(0, INT4_MAX)
    q = (g / scales).round().add(zeros).clamp(0, INT4_MAX).to(torch.int32).reshape(n, k)
    return q, scales.squeeze(-1).t().contiguous(), zeros.squeeze(-1).t().to(torch.int32).contiguous()


def awq_pack(w: torch.Tensor, group_size: int, scales_dtype=torch.float16) -> dict[str, torch.Tensor]:
    """Round-to-nearest AutoAWQ GEMM tensors ``qweight [K, N/8]``, ``qzeros [K/g, N/8]``, ``scales [K/g, N]``."""
    q, scales, zeros = quantize_int4_groups(w, group_size)
    return {"qweight": pack_int4_awq(q.t().contiguous()), "qzeros": pack_int4_awq(zeros),
            "scales": scales.to(scales_dtype)}


def awq_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The torch reference: AutoAWQ GEMM tensors -> ``W^T [K, N]`` in ``scales.dtype``."""
    k = qweight.shape[0]
    group_size = k // scales.shape[0]
    q = unpack_int4_awq(qweight).float()
    zeros = unpack_int4_awq(qzeros).float().repeat_interleave(group_size, dim=0)
    return ((q - zeros) * scales.float().repeat_interleave(group_size, dim=0)).to(scales.dtype)
