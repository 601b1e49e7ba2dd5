"""The MoE formula of ``MoEExecutor.apply`` computed densely, token by token and slot by slot, in float64, from the
inputs alone: it judges every executor, ``eager`` (the oracle the other checks compare with) included."""
from __future__ import annotations

import math

import torch

from nanocore_conformance.base import generator, randn

#: The activations written out, not taken from ``eager`` (gelu is the exact, erf form, as ``F.gelu``).
DENSE_ACTIVATIONS = {
    "silu": lambda t: t * torch.sigmoid(t),
    "gelu": lambda t: 0.5 * t * (1.0 + torch.erf(t / math.sqrt(2.0))),
}


def dense_moe(x, topk_weights, topk_ids, w13, w2, activation: str) -> torch.Tensor:
    """``out[m] = sum_k topk_weights[m,k] * w2[e] @ (act(w13[e,:I] @ x[m]) * (w13[e,I:] @ x[m]))`` with
    ``e = topk_ids[m,k]``; a slot whose id is outside ``[0, E)`` adds nothing. float64, on the CPU."""
    act = DENSE_ACTIVATIONS[activation]
    x, weights, ids = x.double().cpu(), topk_weights.double().cpu(), topk_ids.cpu()
    w13, w2 = w13.double().cpu(), w2.double().cpu()
    num_experts, intermediate = w13.shape[0], w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[m, k])
            if 0 <= e < num_experts:
                gate, up = w13[e, :intermediate] @ x[m], w13[e, intermediate:] @ x[m]
                out[m] += weights[m, k] * (w2[e] @ (act(gate) * up))
    return out


#: (tokens, experts, top_k, renormalise): top_k 1 to 8, the router's weights summing to 1 or raw.
DENSE_SHAPES = ((1, 4, 1, True), (4, 4, 1, False), (5, 4, 2, True), (5, 6, 3, False), (7, 8, 4, True),
                (4, 8, 6, False), (6, 9, 8, True), (9, 12, 8, False))


def dense_case(tokens: int, experts: int, top_k: int, renormalise: bool, hidden: int, intermediate: int, dtype,
               device, seed: int):
    """Token 0 goes to expert 0 and the last expert (and to expert 0 twice from top_k 3: both slots count); from 4
    tokens, tokens 1 to 3 drop one slot each, with ids -1, ``E`` and ``E + 5`` (experts of other EP ranks); other
    slots are distinct random experts, with weights far from uniform."""
    g = generator(seed)
    x = randn(tokens, hidden, seed_gen=g, dtype=dtype, device=device)
    weights = torch.rand(tokens, top_k, generator=g) + 0.05
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    ids[0, 0] = 0
    if top_k >= 2:
        ids[0, -1] = experts - 1
    if top_k >= 3:
        ids[0, 1] = 0
    if tokens >= 4:
        ids[1, 0], ids[2, -1], ids[3, top_k // 2] = -1, experts, experts + 5
    w13 = randn(experts, 2 * intermediate, hidden, seed_gen=g, dtype=dtype, device=device, scale=hidden ** -0.5)
    w2 = randn(experts, hidden, intermediate, seed_gen=g, dtype=dtype, device=device, scale=intermediate ** -0.5)
    return x, weights.to(dtype=dtype, device=device), ids.to(device), w13, w2
