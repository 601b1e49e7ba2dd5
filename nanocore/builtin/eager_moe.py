"""``eager``: a Python loop over the experts that received tokens. The MoE-executor oracle."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nanocore.interfaces import MoEExecutor, builtin_options, check_moe_shapes

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


class EagerMoEExecutor(MoEExecutor):
    auto_priority = 0
    supports_cuda_graph = False  # torch.unique / nonzero synchronise with the host
    activations = tuple(ACTIVATIONS)

    def __init__(self, options=None):
        super().__init__(builtin_options(self, EagerMoEExecutor, "eager", options, {}))

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        act = ACTIVATIONS[activation]
        num_experts, intermediate = w13.shape[0], w2.shape[2]
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert in topk_ids.unique().tolist():
            if not 0 <= expert < num_experts:
                continue  # dropped slots (e.g. experts owned by another EP rank)
            token_idx, slot_idx = (topk_ids == expert).nonzero(as_tuple=True)
            gate_up = x[token_idx] @ w13[expert].t()
            hidden = act(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
            expert_out = (hidden @ w2[expert].t()).float()
            out.index_add_(0, token_idx, expert_out * topk_weights[token_idx, slot_idx, None].float())
        return out.to(x.dtype)
