"""Fused KV store: write new K/V ``[T, Hkv, D]`` into the paged cache at ``slot_mapping`` (slot -1 skipped).

One program per token and side (K or V). Layouts with scales quantize on the way in: per (token, head)
or per group of head_dim, symmetric, ``scale = amax * (1 / qmax)`` (1 where amax is 0), int8 rounds half up
(``floor(x + 0.5)``) and saturates at +-127, fp8 e4m3 saturates at +-448 and rounds to nearest even.
``store_kv_reference`` below is the torch twin and defines the same numbers.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from nanocore.interfaces import KVCache, KVLayout

SCALE_CODES = {"none": 0, "token_head": 1, "group": 2}


def qmax_of(dtype: torch.dtype) -> float:
    """Largest magnitude a quantized cache element holds."""
    if dtype == torch.int8:
        return 127.0
    if dtype == torch.float8_e4m3fn:
        return 448.0
    raise ValueError(f"no quantized KV store for dtype {dtype}; use int8 or float8_e4m3fn")


def smallest_subnormal(dtype: torch.dtype) -> float:
    """The smallest positive value ``dtype`` holds (a scale below it would be stored as 0)."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps


@triton.jit
def _store_one(src_ptr, dst_ptr, sc_ptr, tok, slot, src_stride_t, src_stride_h,
               dst_stride_t, dst_stride_h, sc_stride_t, sc_stride_h,
               NUM_KV_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr,
               ROWS_PAD: tl.constexpr, COLS_PAD: tl.constexpr, SCALE: tl.constexpr,
               QMAX: tl.constexpr, IS_INT: tl.constexpr, SCALE_MIN: tl.constexpr):
    """One token's K or V as a ``[heads * groups, group_size]`` tile: a row shares one scale."""
    r = tl.arange(0, ROWS_PAD)
    c = tl.arange(0, COLS_PAD)
    head = r // NUM_GROUPS
    g = r % NUM_GROUPS
    col = g[:, None] * GROUP_SIZE + c[None, :]
    ok = (r < NUM_KV_HEADS * NUM_GROUPS)[:, None] & (c < GROUP_SIZE)[None, :]
    x = tl.load(src_ptr + tok * src_stride_t + head[:, None] * src_stride_h + col, mask=ok, other=0.0)
    dst = dst_ptr + slot * dst_stride_t + head[:, None] * dst_stride_h + col
    if SCALE == 0:
        tl.store(dst, x.to(dst_ptr.dtype.element_ty), mask=ok)
    else:
        xf = x.to(tl.float32)
        amax = tl.max(tl.abs(xf), 1)
        scale = tl.where(amax > 0, amax * (1.0 / QMAX), 1.0)  # torch multiplies by 1/qmax as well
        # quantize with the scale as stored (e.g. fp16), never below its smallest subnormal (0 would lose the group)
        scale = tl.maximum(scale, SCALE_MIN).to(sc_ptr.dtype.element_ty).to(tl.float32)
        y = tl.div_rn(xf, scale[:, None])  # IEEE division: same bits as the twin
        if IS_INT:
            y = tl.floor(y + 0.5)
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
        tl.store(dst, y.to(dst_ptr.dtype.element_ty), mask=ok)
        tl.store(sc_ptr + slot * sc_stride_t + head * sc_stride_h + g, scale.to(sc_ptr.dtype.element_ty),
                 mask=r < NUM_KV_HEADS * NUM_GROUPS)


# the runner's slot mapping is a view into one per-step upload at an offset of 8 x tokens bytes: its 16-byte
# alignment flips with the token count's parity, which must not compile a second variant (one scalar load)
@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])
def store_kv_kernel(
    k_ptr, v_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
    k_stride_t, k_stride_h, v_stride_t, v_stride_h, kc_stride_t, kc_stride_h, vc_stride_t, vc_stride_h,
    ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
    NUM_KV_HEADS: tl.constexpr,
    K_GROUPS: tl.constexpr, K_GROUP_SIZE: tl.constexpr, K_ROWS: tl.constexpr, K_COLS: tl.constexpr,
    K_SCALE: tl.constexpr, K_QMAX: tl.constexpr, K_INT: tl.constexpr, K_SCALE_MIN: tl.constexpr,
    V_GROUPS: tl.constexpr, V_GROUP_SIZE: tl.constexpr, V_ROWS: tl.constexpr, V_COLS: tl.constexpr,
    V_SCALE: tl.constexpr, V_QMAX: tl.constexpr, V_INT: tl.constexpr, V_SCALE_MIN: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    if tl.program_id(1) == 0:  # K and V in programs of their own: a decode step's two chains run side by side
        _store_one(k_ptr, kc_ptr, ks_ptr, tok, slot, k_stride_t, k_stride_h, kc_stride_t, kc_stride_h,
                   ks_stride_t, ks_stride_h, NUM_KV_HEADS, K_GROUPS, K_GROUP_SIZE, K_ROWS, K_COLS,
                   K_SCALE, K_QMAX, K_INT, K_SCALE_MIN)
    else:
        _store_one(v_ptr, vc_ptr, vs_ptr, tok, slot, v_stride_t, v_stride_h, vc_stride_t, vc_stride_h,
                   vs_stride_t, vs_stride_h, NUM_KV_HEADS, V_GROUPS, V_GROUP_SIZE, V_ROWS, V_COLS,
                   V_SCALE, V_QMAX, V_INT, V_SCALE_MIN)


def _side_args(cache_t: torch.Tensor, scale_t: torch.Tensor | None, granularity: str,
               layout: KVLayout, num_kv_heads: int, head_dim: int) -> dict:
    """Constexprs for K or V: rows are (head, scale group), columns the elements sharing one scale."""
    if SCALE_CODES[granularity] and scale_t is None:
        raise ValueError(f"layout has {granularity} scales but the cache has no scale tensor")
    return _side_constexprs(cache_t.dtype, scale_t.dtype if scale_t is not None else None, granularity,
                            layout, num_kv_heads, head_dim)


@functools.lru_cache(maxsize=64)
def _side_constexprs(cache_dtype: torch.dtype, scale_dtype: torch.dtype | None, granularity: str,
                     layout: KVLayout, num_kv_heads: int, head_dim: int) -> dict:
    """Cached: eager steps call the store once per layer with the same layout (host time, not GPU time)."""
    groups = max(layout.num_scale_groups(granularity, head_dim), 1)
    group_size = head_dim // groups
    code = SCALE_CODES[granularity]
    return dict(GROUPS=groups, GROUP_SIZE=group_size, ROWS=triton.next_power_of_2(num_kv_heads * groups),
                COLS=triton.next_power_of_2(group_size), SCALE=code,
                QMAX=qmax_of(cache_dtype) if code else 1.0, INT=cache_dtype == torch.int8,
                SCALE_MIN=smallest_subnormal(scale_dtype) if code else 0.0)


def store_kv(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             layout: KVLayout) -> None:
    """Write ``k, v [T, Hkv, D]`` into ``cache`` at ``slot_mapping`` (-1 skipped), quantizing per ``layout``."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    # strided token / head views (the qkv split) go in as they are; only a strided head_dim needs a copy
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    kc = cache.k.view(-1, *cache.k.shape[2:])
    vc = cache.v.view(-1, *cache.v.shape[2:])
    ks = cache.k_scale.view(-1, *cache.k_scale.shape[2:]) if cache.k_scale is not None else kc
    vs = cache.v_scale.view(-1, *cache.v_scale.shape[2:]) if cache.v_scale is not None else vc
    ka = _side_args(cache.k, cache.k_scale, layout.k_scale, layout, num_kv_heads, head_dim)
    va = _side_args(cache.v, cache.v_scale, layout.v_scale, layout, num_kv_heads, head_dim)
    store_kv_kernel[(num_tokens, 2)](
        k, v, slot_mapping, kc, vc, ks, vs,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), kc.stride(0), kc.stride(1),
        vc.stride(0), vc.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
        NUM_KV_HEADS=num_kv_heads, **{f"K_{n}": x for n, x in ka.items()}, **{f"V_{n}": x for n, x in va.items()},
        num_warps=4,
    )


def quantize_reference(x: torch.Tensor, dtype: torch.dtype, granularity: str, group_size: int,
                       scale_dtype: torch.dtype = torch.float32):
    """Torch twin of the kernel's quantizer: ``x [T, Hkv, D]`` -> (values in ``dtype``, scales [T, Hkv, G] in
    ``scale_dtype``, which the values were quantized with)."""
    t, h, d = x.shape
    groups = 1 if granularity == "token_head" else d // group_size
    xf = x.float().view(t, h, groups, d // groups)
    qmax = qmax_of(dtype)
    amax = xf.abs().amax(-1)
    # times the reciprocal, which is what torch's CUDA division by a scalar does anyway
    scale = torch.where(amax > 0, amax * (1.0 / qmax), torch.ones_like(amax))
    scale = scale.clamp_min(smallest_subnormal(scale_dtype)).to(scale_dtype).float()  # as stored, never 0
    y = xf / scale[..., None]
    if dtype == torch.int8:
        y = torch.floor(y + 0.5)
    y = y.clamp(-qmax, qmax)
    return y.to(dtype).view(t, h, d), scale.to(scale_dtype)


def store_kv_reference(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                       layout: KVLayout) -> None:
    """Torch twin of ``store_kv``."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    for x, dst, scales, granularity in ((k, cache.k, cache.k_scale, layout.k_scale),
                                        (v, cache.v, cache.v_scale, layout.v_scale)):
        flat = dst.view(-1, *dst.shape[2:])
        if granularity == "none":
            flat[slots] = x[valid].to(dst.dtype)
            continue
        values, scale = quantize_reference(x[valid], dst.dtype, granularity, layout.group_size, scales.dtype)
        flat[slots] = values
        scales.view(-1, *scales.shape[2:])[slots] = scale
