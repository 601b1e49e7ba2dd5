"""Torch twin of the fused kernels: the same alignment and block-wise grouped GEMMs, in batched matmuls.

It runs on any device and mirrors the kernels step for step (fp32 accumulation, the intermediate
stored in ``x.dtype``, routed weights applied before the fp32 sum over ``top_k``), so CPU tests check
the alignment and blocking logic and the Triton tests compare kernel against twin. fp8 experts (``fp8_channel``)
are widened exactly and their per-row scales multiply the fp32 products, as in the kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nanocore_triton_fused_moe.align import align_slots


def fused_moe_torch(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                    w2: torch.Tensor, block_m: int = 16, w13_scale: torch.Tensor | None = None,
                    w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[M, H]`` in ``x.dtype``; see ``MoEExecutor.apply`` for the contract (scales: fp8 ``w13`` / ``w2``)."""
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, intermediate = w13.shape[0], w2.shape[2]
    aligned = align_slots(topk_ids, num_experts, block_m)
    rows = aligned.sorted_slots.long()
    num_slots = aligned.num_slots
    num_blocks = aligned.block_experts.shape[0]
    experts = aligned.block_experts.long()
    tokens = (rows // top_k).clamp(max=num_tokens - 1)  # padding rows read some token; never stored
    a = x[tokens].float().view(num_blocks, block_m, hidden)
    gate_up = torch.bmm(a, w13[experts].float().transpose(1, 2))
    if w13_scale is not None:  # per output column of each block's expert, on the fp32 products
        gate_up = gate_up * w13_scale[experts].float()[:, None, :]
    h = (F.silu(gate_up[..., :intermediate]) * gate_up[..., intermediate:]).to(x.dtype)
    y = torch.bmm(h.float(), w2[experts].float().transpose(1, 2))
    if w2_scale is not None:
        y = y * w2_scale[experts].float()[:, None, :]
    y = y.view(-1, hidden)
    weights = topk_weights.reshape(-1).float()
    y = y * weights[rows.clamp(max=num_slots - 1)][:, None]
    out_slots = torch.zeros(num_slots + 1, hidden, dtype=torch.float32, device=x.device)
    out_slots.index_copy_(0, rows, y)  # padding rows all land in the spare row ``num_slots``
    return out_slots[:num_slots].view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
