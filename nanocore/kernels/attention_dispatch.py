"""Entry point from the attention layer (and KV codecs) to the Triton kernels."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when the Triton kernels can run: a CUDA device and an importable Triton."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def paged_attention(q, k, v, cache, meta, scale: float) -> torch.Tensor:
    """Same result as ``paged_attention_reference``; reads the codec's layout natively."""
    from nanocore.kernels.paged_attention import paged_attention as triton_paged_attention
    layout = meta.codec.layout(q.dtype) if cache is not None and meta.codec is not None else None
    return triton_paged_attention(q, k, v, cache, meta, scale, layout=layout)


def store_kv(cache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, layout) -> None:
    """Fused write of new K/V into the paged cache (quantizing per ``layout``); slot -1 is skipped."""
    from nanocore.kernels.kv_store import store_kv as triton_store_kv
    triton_store_kv(cache, k, v, slot_mapping, layout)
