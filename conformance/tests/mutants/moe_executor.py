"""MoE executors the suite must accept (CORRECT) and reject (MUTANTS), written as a third party would: each
subclasses the ``eager`` oracle and plants one bug."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nanocore.toolkit.moe_weights import dequantize_fp8_experts
from nanocore.toolkit.reference import EagerMoEExecutor
from nanocore.interfaces import check_moe_shapes, moe_weight_format
from nanocore_conformance import MoEExecutorConformance, bind_all


class PlainMoE(EagerMoEExecutor):
    """The oracle itself, seen as a third party's class."""


class CountsDroppedSlots(EagerMoEExecutor):
    """Clamps expert ids into range, so slots routed to no expert (-1, or >= E) land on the first or last."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        return super().apply(x, topk_weights, topk_ids.clamp(0, w13.shape[0] - 1), w13, w2, activation)


class IgnoresTopkWeights(EagerMoEExecutor):
    """Sums the experts' outputs unweighted."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        return super().apply(x, torch.ones_like(topk_weights), topk_ids, w13, w2, activation)


def expert_loop(x, topk_weights, topk_ids, w13, w2, expert_out):
    """The eager loop over experts with ``expert_out(expert, x_rows, weights_of_rows)`` planted per mutant."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in topk_ids.unique().tolist():
        if 0 <= expert < w13.shape[0]:
            token_idx, slot_idx = (topk_ids == expert).nonzero(as_tuple=True)
            rows = expert_out(expert, x[token_idx], topk_weights[token_idx, slot_idx, None])
            out.index_add_(0, token_idx, rows.float())
    return out.to(x.dtype)


class WeightBeforeActivation(EagerMoEExecutor):
    """Scales the token by its routing weight before the expert MLP instead of scaling the expert's output."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        intermediate = w2.shape[2]

        def expert_out(e, rows, weights):
            gate_up = (rows * weights) @ w13[e].t()
            return (F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]) @ w2[e].t()
        return expert_loop(x, topk_weights, topk_ids, w13, w2, expert_out)


class SwapsGateAndUp(EagerMoEExecutor):
    """Reads w13 as up rows then gate rows (the activation goes on the up projection)."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        intermediate = w2.shape[2]
        swapped = torch.cat([w13[:, intermediate:], w13[:, :intermediate]], dim=1)
        return super().apply(x, topk_weights, topk_ids, swapped, w2, activation)


class ChunkedAbove64Tokens(EagerMoEExecutor):
    """Above 64 tokens switches to a chunked path whose loop forgets the last partial chunk of 64."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        if x.shape[0] <= 64:
            return super().apply(x, topk_weights, topk_ids, w13, w2, activation)
        out = torch.zeros_like(x)
        for start in range(0, x.shape[0] // 64 * 64, 64):
            chunk = slice(start, start + 64)
            out[chunk] = super().apply(x[chunk], topk_weights[chunk], topk_ids[chunk], w13, w2, activation)
        return out


class ExpertIdsInFiveBits(EagerMoEExecutor):
    """Stores expert ids in 5 bits (a 32-expert limit): with more experts, ids >= 32 alias to id - 32."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        valid = (topk_ids >= 0) & (topk_ids < w13.shape[0])
        return super().apply(x, topk_weights, torch.where(valid, topk_ids % 32, topk_ids), w13, w2, activation)


class DropsOnlyTheSentinelIds(EagerMoEExecutor):
    """Treats only -1 and ``E`` as dropped slots: ids of other EP ranks' experts past ``E`` index out of range."""

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        intermediate, act = w2.shape[2], {"silu": F.silu, "gelu": F.gelu}[activation]
        sentinels = (-1, w13.shape[0])

        def expert_out(e, rows, weights):
            gate_up = rows @ w13[e].t()
            return ((act(gate_up[:, :intermediate]) * gate_up[:, intermediate:]) @ w2[e].t()).float() * weights
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert in topk_ids.unique().tolist():
            if expert not in sentinels:
                token_idx, slot_idx = (topk_ids == expert).nonzero(as_tuple=True)
                out.index_add_(0, token_idx, expert_out(expert, x[token_idx], topk_weights[token_idx, slot_idx, None]))
        return out.to(x.dtype)


class DequantizingMoE(EagerMoEExecutor):
    """Takes ``fp8_channel`` experts and runs the oracle on their dequantized weights (correct)."""

    weight_formats = ("float", "fp8_channel")

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu", *, w13_scale=None, w2_scale=None):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        if moe_weight_format(w13, w2, w13_scale, w2_scale) == "fp8_channel":
            w13, w2 = dequantize_fp8_experts(w13, w2, *self.scales(w13_scale, w2_scale), x.dtype)
        return super().apply(x, topk_weights, topk_ids, w13, w2, activation)

    def scales(self, w13_scale, w2_scale):
        return w13_scale, w2_scale


class IgnoresFp8Scales(DequantizingMoE):
    """Declares ``fp8_channel`` but widens the fp8 weights without multiplying by their scales."""

    def scales(self, w13_scale, w2_scale):
        return torch.ones_like(w13_scale), torch.ones_like(w2_scale)


class GateScalesOnUpRows(DequantizingMoE):
    """Applies the gate rows' scales to the up rows too (reads ``w13_scale[:, :I]`` for both halves)."""

    def scales(self, w13_scale, w2_scale):
        gate = w13_scale[:, : w13_scale.shape[1] // 2]
        return torch.cat([gate, gate], dim=1), w2_scale


CORRECT = [PlainMoE, DequantizingMoE]
MUTANTS = [CountsDroppedSlots, IgnoresTopkWeights, WeightBeforeActivation, SwapsGateAndUp, ChunkedAbove64Tokens,
           ExpertIdsInFiveBits, DropsOnlyTheSentinelIds, IgnoresFp8Scales, GateScalesOnUpRows]
bind_all(globals(), MoEExecutorConformance, CORRECT + MUTANTS)
