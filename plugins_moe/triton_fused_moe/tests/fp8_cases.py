"""Shared inputs of the fp8-expert tests (CPU interpreter and GPU)."""
from __future__ import annotations

import torch

from nanocore.toolkit.moe_weights import quantize_fp8_experts


def fp8_inputs(m, e, k, h, i, dtype=torch.float32, drop=0.0, seed=0, softmax_weights=False):
    """Random tokens and routing; experts quantized per row after random per-row gains (so scales differ)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(dtype)
    weights = torch.randn(m, k, generator=g).softmax(-1) if softmax_weights else torch.rand(m, k, generator=g)
    ids = torch.randint(0, e, (m, k), generator=g)
    ids = torch.where(torch.rand(m, k, generator=g) < drop, -1, ids)

    def gain(*shape):  # a random factor in [1/4, 4] per output row
        return torch.exp2(torch.rand(*shape, 1, generator=g) * 4 - 2)
    w13 = torch.randn(e, 2 * i, h, generator=g) * h ** -0.5 * gain(e, 2 * i)
    w2 = torch.randn(e, h, i, generator=g) * i ** -0.5 * gain(e, h)
    q13, s13, q2, s2 = quantize_fp8_experts(w13, w2)
    return (x, weights, ids, q13, q2), {"w13_scale": s13, "w2_scale": s2}
