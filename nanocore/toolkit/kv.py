"""KV-cache building blocks for codecs whose layout is of the core's family (``KVLayout``).

``store_layout`` writes K/V the way the core attention reads them (the fused Triton store on CUDA, its torch
twin elsewhere: same numbers); ``dequantize`` / ``gather_layout`` are the dequantizing reference a codec's
``gather`` can return. A codec built from these is read natively by the core's attention kernels.
"""
from __future__ import annotations

import torch

from nanocore.interfaces.kv_codec import KVCache, KVLayout
from nanocore.kernels import attention_dispatch

__all__ = ["flat_slots", "store_layout", "dequantize", "gather_layout", "quantize_reference", "store_kv_reference"]


def flat_slots(cache_tensor: torch.Tensor) -> torch.Tensor:
    """View ``[num_blocks, block_size, ...]`` as ``[num_slots, ...]``."""
    return cache_tensor.view(-1, *cache_tensor.shape[2:])


def store_layout(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                 layout: KVLayout) -> None:
    """Write ``k``, ``v`` ``[tokens, kv_heads, head_dim]`` at ``slot_mapping`` (-1 skipped), quantized per
    ``layout``. On CUDA one fused launch with no host synchronisation (CUDA-graph safe); strided views are fine."""
    if k.is_cuda and attention_dispatch.available():
        attention_dispatch.store_kv(cache, k, v, slot_mapping, layout)
    else:
        store_kv_reference(cache, k, v, slot_mapping, layout)


# The kernels module imports Triton; importing it lazily keeps this module importable before TRITON_INTERPRET is set.
def quantize_reference(x: torch.Tensor, dtype: torch.dtype, granularity: str, group_size: int = 0,
                       scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The store's quantizer in torch: ``x [T, H, D]`` -> (values in ``dtype``, scales ``[T, H, G]``)."""
    from nanocore.kernels.kv_store import quantize_reference as reference
    return reference(x, dtype, granularity, group_size, scale_dtype)


def store_kv_reference(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                       layout: KVLayout) -> None:
    """Torch twin of the fused store (any device)."""
    from nanocore.kernels.kv_store import store_kv_reference as reference
    reference(cache, k, v, slot_mapping, layout)


def dequantize(values: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``values [N, H, D]`` times ``scales [N, H, G]`` broadcast over each group of ``D / G`` elements."""
    if scales is None:
        return values.to(dtype)
    n, h, d = values.shape
    groups = scales.shape[-1]
    grouped = values.float().view(n, h, groups, d // groups) * scales.float()[..., None]
    return grouped.view(n, h, d).to(dtype)


def gather_layout(cache: KVCache, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized ``(k, v)`` ``[len(slots), kv_heads, head_dim]`` in ``dtype``: what the core attention reads."""
    k_scale = flat_slots(cache.k_scale)[slots] if cache.k_scale is not None else None
    v_scale = flat_slots(cache.v_scale)[slots] if cache.v_scale is not None else None
    return (dequantize(flat_slots(cache.k)[slots], k_scale, dtype),
            dequantize(flat_slots(cache.v)[slots], v_scale, dtype))
