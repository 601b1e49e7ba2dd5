"""What the core attention reads from a KV cache, derived from the codec's declared ``KVLayout`` alone.

The core's Triton attention loads the raw cache tensors, converts them and multiplies by their scales
(``[blocks, block_size, kv_heads, groups]``, group ``g`` covering ``head_dim / groups`` elements). These
helpers do the same in float32, independently of the codec's ``gather``, and bound the error a value stored
in the layout's format may have: half the format's spacing at that value, times its scale.
"""
from __future__ import annotations

import torch

from nanocore.interfaces import KVCache, KVLayout


def num_groups(layout: KVLayout, granularity: str, head_dim: int) -> int:
    return layout.num_scale_groups(granularity, head_dim)


def layout_bytes_per_token(layout: KVLayout, heads: int, head_dim: int) -> int:
    """Bytes of one token in one layer, from the layout: K and V values plus their scales."""
    total = 0
    for dtype, granularity in ((layout.k_dtype, layout.k_scale), (layout.v_dtype, layout.v_scale)):
        total += heads * head_dim * dtype.itemsize
        total += heads * num_groups(layout, granularity, head_dim) * layout.scale_dtype.itemsize
    return total


def check_allocation(cache: KVCache, layout: KVLayout, num_blocks: int, block_size: int, heads: int,
                     head_dim: int) -> None:
    """Every tensor the core reads has the shape and dtype the layout declares."""
    for side, values, scales, dtype, granularity in (
            ("K", cache.k, cache.k_scale, layout.k_dtype, layout.k_scale),
            ("V", cache.v, cache.v_scale, layout.v_dtype, layout.v_scale)):
        expected = (num_blocks, block_size, heads, head_dim)
        assert tuple(values.shape) == expected and values.dtype == dtype, (
            f"allocate: the {side} cache is {tuple(values.shape)} {values.dtype} but the layout declares "
            f"{expected} {dtype}; the core attention reads the layout, so allocate exactly what layout() says")
        groups = num_groups(layout, granularity, head_dim)
        if groups == 0:
            assert scales is None, (
                f"allocate: the layout declares no {side} scales (granularity 'none') but the cache has a "
                f"{side} scale tensor; declare the scale granularity you store in layout()")
            continue
        expected = (num_blocks, block_size, heads, groups)
        assert scales is not None and tuple(scales.shape) == expected and scales.dtype == layout.scale_dtype, (
            f"allocate: the layout declares {side} scales {granularity!r} -> {expected} {layout.scale_dtype}, "
            f"the cache has {None if scales is None else (tuple(scales.shape), scales.dtype)}; store the scales "
            f"exactly as layout() declares (one per token and head, or one per group of group_size elements)")
        assert values.is_contiguous() and scales.is_contiguous(), (
            f"allocate: the {side} cache tensors must be contiguous: the core attention indexes them by slot")


def flat(tensor: torch.Tensor) -> torch.Tensor:
    """``[blocks, block_size, ...]`` as ``[slots, ...]``."""
    return tensor.reshape(tensor.shape[0] * tensor.shape[1], *tensor.shape[2:])


def raw_side(values: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor):
    """(stored values as float32 ``[n, H, D]``, per-element scales ``[n, H, D]`` (ones without scales))."""
    q = flat(values)[slots].float()
    if scales is None:
        return q, torch.ones_like(q)
    s = flat(scales)[slots].float()
    return q, s.repeat_interleave(q.shape[-1] // s.shape[-1], dim=-1)


def read_like_core(cache: KVCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 ``(k, v)`` at ``slots`` as the core attention dequantizes them from the raw tensors."""
    k, ks = raw_side(cache.k, cache.k_scale, slots)
    v, vs = raw_side(cache.v, cache.v_scale, slots)
    return k * ks, v * vs


def half_spacing(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the distance between neighbouring values of ``dtype`` around ``magnitude`` (0.5 for integers)."""
    if not dtype.is_floating_point:
        return torch.full_like(magnitude, 0.5)
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(magnitude.clamp_min(info.tiny)))
    return 0.5 * torch.exp2(exponent) * info.eps


def largest(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max)


def check_side(side: str, x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor | None,
               granularity: str, slots: torch.Tensor, what: str, scale_rule: str | None = None) -> None:
    """Stored ``values`` (times ``scales``) at ``slots`` are ``x`` rounded to the format: within half a step of it,
    and a scale that uses at least half of the format's range (``scale_rule`` "amax": exactly amax / qmax)."""
    q, s = raw_side(values, scales, slots)
    x = x.float().cpu()
    q, s = q.cpu(), s.cpu()
    ideal = x / s
    # IEEE float32 arithmetic in x / s and q * s may cost a few units of x's last place
    bound = s * half_spacing(torch.maximum(ideal.abs(), q.abs()), values.dtype) * (1 + 1e-3) + 1e-6 * x.abs()
    err = (q * s - x).abs()
    bad = ~(err <= bound)
    if bad.any():
        i = int(torch.where(bad, torch.nan_to_num(err / bound, nan=float("inf")), -1.0).flatten().argmax())
        n, h, d = (int(c) for c in torch.unravel_index(torch.tensor(i), x.shape))
        raise AssertionError(
            f"store ({what}): slot {int(slots[n])} {side} head {h} element {d} was given {x[n, h, d].item():.6g} "
            f"but the cache holds {q[n, h, d].item():.6g} x scale {s[n, h, d].item():.6g} = "
            f"{(q * s)[n, h, d].item():.6g}: off by {err[n, h, d].item():.3g}, more than the "
            f"{values.dtype} rounding allows ({bound[n, h, d].item():.3g}); {int(bad.sum())} of {bad.numel()} "
            f"elements are off. store must write exactly the slots in slot_mapping, each value rounded to the "
            f"nearest representable one of the declared layout (no truncation, no clipping)")
    if granularity == "none":
        return
    groups = scales.shape[-1]
    amax = x.abs().view(*x.shape[:2], groups, -1).amax(-1)
    group_scales = flat(scales)[slots].float().cpu()
    if scale_rule is not None:
        check_scale_rule(side, amax, group_scales, values.dtype, scales.dtype, scale_rule, slots, what)
    check_range_use(side, q, s, values.dtype, groups, slots, what,
                    (amax > 0) & (group_scales > smallest_subnormal(scales.dtype)))


def smallest_subnormal(dtype: torch.dtype) -> float:
    """The smallest positive ``dtype`` value: no scale can be smaller, however small what it scales."""
    return torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps


def check_scale_rule(side: str, amax: torch.Tensor, got: torch.Tensor, dtype: torch.dtype, scale_dtype: torch.dtype,
                     rule: str, slots: torch.Tensor, what: str) -> None:
    """``"amax"``: every scale is amax / qmax in ``scale_dtype`` (within one of its steps), never below its smallest
    subnormal, and 1 for an all-zero group (the toolkit's quantizer)."""
    assert rule == "amax", f"conformance_requirements scale_rule is {rule!r}; declare \"amax\" or None (no rule)"
    qmax = largest(dtype)
    ideal = torch.where(amax > 0, amax / qmax, torch.ones_like(amax)).clamp_min(smallest_subnormal(scale_dtype))
    want = ideal.to(scale_dtype).float()
    bad = ~((got - want).abs() <= 2 * half_spacing(want, scale_dtype))
    if bad.any():
        n, h, g = (int(c) for c in bad.nonzero()[0])
        raise AssertionError(
            f"store ({what}): slot {int(slots[n])} {side} head {h} scale group {g} has max|x| {amax[n, h, g]:.6g} "
            f"and scale {got[n, h, g]:.6g}; the declared scale_rule \"amax\" makes it {want[n, h, g]:.6g}: "
            f"max|x| / {qmax:g} (the {dtype} range) in {scale_dtype}, at least its smallest subnormal "
            f"{smallest_subnormal(scale_dtype):.3g}, and 1 where the group is all zeros")


def check_range_use(side: str, q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype, groups: int,
                    slots: torch.Tensor, what: str, checked: torch.Tensor) -> None:
    """A scale more than twice ``amax / qmax`` throws away a bit of the format on every value it scales (``checked``:
    the groups this applies to: not all zeros, scale above the scale dtype's smallest subnormal)."""
    n, h, d = q.shape
    used = q.abs().view(n, h, groups, d // groups).amax(-1)
    qmax = largest(dtype)
    wasteful = (used < qmax / 2) & checked
    if wasteful.any():
        i, head, g = (int(c) for c in wasteful.nonzero()[0])
        raise AssertionError(
            f"store ({what}): slot {int(slots[i])} {side} head {head} scale group {g} has scale "
            f"{s[i, head, g * (d // groups)].item():.6g}, so its largest stored |value| is only "
            f"{used[i, head, g].item():.6g} of the {dtype} range {qmax:g}: the scale wastes precision; use "
            f"scale = max|x| / {qmax:g} over the group")


def check_stored(cache: KVCache, layout: KVLayout, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 what: str, scale_rule: str | None = None) -> None:
    """The raw cache at ``slots`` holds ``k``, ``v`` in the declared layout's format."""
    check_side("K", k, cache.k, cache.k_scale, layout.k_scale, slots, what, scale_rule)
    check_side("V", v, cache.v, cache.v_scale, layout.v_scale, slots, what, scale_rule)
