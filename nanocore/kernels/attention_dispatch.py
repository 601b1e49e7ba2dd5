"""Entry point from the attention layer to the Triton kernels (filled in by the GPU fast path)."""
from __future__ import annotations


def available() -> bool:
    return False


def paged_attention(q, k, v, cache, meta, scale):
    raise NotImplementedError("Triton paged attention is not implemented yet")
