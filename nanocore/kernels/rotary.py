"""Rotary embedding (NeoX rotate-half) applied in place to q and k, one program per token for both.

Reads the fp32 ``cos_sin_cache[max_position, rotary_dim]`` (cos | sin halves) at each token's position.
The numbers follow ``rotary_reference`` in nanocore/layers/rotary.py: cos/sin are rounded to the q/k
dtype, and each product and each sum is rounded to it, as the torch ops do one at a time.

With ``NORM`` (Qwen3's per-head q / k RMSNorm before RoPE) the same program first normalizes each head, as
``rms_norm_reference`` does (fp32 statistics, ``weight * normed`` rounded to the dtype): one launch instead
of three per layer, which matters in small decode steps where every launch costs a few microseconds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rotate_heads(x_ptr, w_ptr, eps, tok, stride_t, stride_h, cos, sin,
                       H: tl.constexpr, HALF: tl.constexpr, H_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
                       NORM: tl.constexpr):
    """Rotates the first ``2 * HALF`` features of the ``H`` heads of one token; the rest stay as they are.
    With ``NORM`` (only when ``2 * HALF`` is the whole head) each head is RMS-normalized by ``w`` first."""
    h = tl.arange(0, H_PAD)
    c = tl.arange(0, HALF_PAD)
    ok = (h < H)[:, None] & (c < HALF)[None, :]
    p1 = x_ptr + tok * stride_t + h[:, None] * stride_h + c[None, :]
    ty = x_ptr.dtype.element_ty
    x1 = tl.load(p1, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=ok, other=0.0).to(tl.float32)
    if NORM:
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + c, mask=c < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + c, mask=c < HALF, other=0.0).to(tl.float32)[None, :]
        # the reference rounds the normalized value, then the weight product, to the dtype
        x1 = (w1 * (x1 * inv_rms).to(ty).to(tl.float32)).to(ty).to(tl.float32)
        x2 = (w2 * (x2 * inv_rms).to(ty).to(tl.float32)).to(ty).to(tl.float32)
    o1 = ((x1 * cos).to(ty).to(tl.float32) - (x2 * sin).to(ty).to(tl.float32)).to(ty)
    o2 = ((x2 * cos).to(ty).to(tl.float32) + (x1 * sin).to(ty).to(tl.float32)).to(ty)
    tl.store(p1, o1, mask=ok)
    tl.store(p1 + HALF, o2, mask=ok)


@triton.jit
def rotary_kernel(
    pos_ptr, cache_ptr, q_ptr, k_ptr, qw_ptr, kw_ptr, q_eps, k_eps,
    cache_stride, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    Q_PAD: tl.constexpr, KV_PAD: tl.constexpr, HALF_PAD: tl.constexpr, NORM: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    c = tl.arange(0, HALF_PAD)
    row = cache_ptr + pos * cache_stride
    cos = tl.load(row + c, mask=c < HALF, other=0.0)
    sin = tl.load(row + HALF + c, mask=c < HALF, other=0.0)
    # torch casts cos/sin to the q/k dtype before the products
    qc = cos.to(q_ptr.dtype.element_ty).to(tl.float32)[None, :]
    qs = sin.to(q_ptr.dtype.element_ty).to(tl.float32)[None, :]
    _norm_rotate_heads(q_ptr, qw_ptr, q_eps, tok, q_stride_t, q_stride_h, qc, qs, NUM_Q_HEADS, HALF, Q_PAD, HALF_PAD,
                       NORM)
    kc = cos.to(k_ptr.dtype.element_ty).to(tl.float32)[None, :]
    ks = sin.to(k_ptr.dtype.element_ty).to(tl.float32)[None, :]
    _norm_rotate_heads(k_ptr, kw_ptr, k_eps, tok, k_stride_t, k_stride_h, kc, ks, NUM_KV_HEADS, HALF, KV_PAD, HALF_PAD,
                       NORM)


def heads_view(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``[T, H, D]`` view of ``[T, H*D]`` (or ``[T, H, D]``) sharing storage, for the in-place write."""
    return x.view(x.shape[0], -1, head_dim)


def can_rotate_in_place(q: torch.Tensor, k: torch.Tensor, head_dim: int) -> bool:
    """The kernel needs unit stride within a head and a ``[T, H, D]`` view of the same storage."""
    try:
        return all(heads_view(x, head_dim).stride(-1) == 1 for x in (q, k))
    except RuntimeError:
        return False


#: Qwen3's per-head norms for the fused kernel: ((q weight, q eps), (k weight, k eps)).
QKNorm = tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]]


def can_fuse_qk_norm(q: torch.Tensor, head_dim: int, rotary_dim: int, qk_norm: QKNorm) -> bool:
    """The fused per-head RMSNorm needs the whole head rotated and weights of the q / k dtype (the
    reference's ``weight * normed`` then rounds to that dtype, as the kernel does)."""
    return rotary_dim == head_dim and all(w.dtype == q.dtype and w.numel() == head_dim for w, _ in qk_norm)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                     head_dim: int, rotary_dim: int,
                     qk_norm: QKNorm | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as ``rotary_reference`` (after ``rms_norm_reference`` of each head when ``qk_norm`` is given,
    see ``can_fuse_qk_norm``), written into ``q`` and ``k``; returns them."""
    if qk_norm is not None and not can_fuse_qk_norm(q, head_dim, rotary_dim, qk_norm):
        raise ValueError(f"rotary_embedding: the fused q / k RMSNorm needs rotary_dim == head_dim ({rotary_dim} vs "
                         f"{head_dim}) and {head_dim}-element weights of dtype {q.dtype}; normalize first instead")
    qv, kv = heads_view(q, head_dim), heads_view(k, head_dim)
    num_tokens = qv.shape[0]
    if num_tokens == 0:
        return q, k
    half = rotary_dim // 2
    q_pad, kv_pad, half_pad = (triton.next_power_of_2(n) for n in (qv.shape[1], kv.shape[1], half))
    warps = min(max(q_pad * half_pad // 256, 1), 8)
    (q_weight, q_eps), (k_weight, k_eps) = qk_norm if qk_norm is not None else ((qv, 0.0), (kv, 0.0))  # unread
    rotary_kernel[(num_tokens,)](
        positions, cos_sin_cache, qv, kv, q_weight, k_weight, float(q_eps), float(k_eps),
        cos_sin_cache.stride(0), qv.stride(0), qv.stride(1), kv.stride(0), kv.stride(1),
        NUM_Q_HEADS=qv.shape[1], NUM_KV_HEADS=kv.shape[1], HALF=half,
        Q_PAD=q_pad, KV_PAD=kv_pad, HALF_PAD=half_pad, NORM=qk_norm is not None, num_warps=warps)
    return q, k
