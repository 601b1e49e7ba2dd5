"""Activation-aware scale search (AWQ, Lin et al. 2023) over one decoder layer's checkpoint tensors.

Input channels that see large activations are scaled up before int4 rounding, and the inverse scale is
folded into the op that produces those activations (the RMSNorm before q/k/v and gate/up, up_proj
before down_proj, v_proj before o_proj when their shapes match), so the float model is unchanged and
only the rounding error moves away from the salient channels.
"""
from __future__ import annotations

import torch

from nanocore.toolkit.numerics import quantize_int4_groups

#: (producer tensor, consumers) per layer, HF Llama / Qwen names relative to ``model.layers.N``.
FOLDS = (
    ("input_layernorm.weight", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("post_attention_layernorm.weight", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj.weight", ("mlp.down_proj",)),
    ("self_attn.v_proj.weight", ("self_attn.o_proj",)),
)


def fake_quantize(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Round-to-nearest int4 and back, in float32 (what the checkpoint will compute with)."""
    q, scales, zeros = quantize_int4_groups(w, group_size)
    scales = scales.t().repeat_interleave(group_size, dim=1)
    zeros = zeros.t().float().repeat_interleave(group_size, dim=1)
    return (q.float() - zeros) * scales


def search_scale(x: torch.Tensor, weights: list[torch.Tensor], group_size: int, grid: int = 20) -> torch.Tensor:
    """Per-input-channel scale ``s [K]`` minimising ``|x W^T - x diag(1/s) Q(W diag(s))^T|`` over a ratio grid."""
    x = x.float().reshape(-1, x.shape[-1])
    w = torch.cat([t.float() for t in weights])
    reference = x @ w.t()
    x_mean = x.abs().mean(dim=0)
    best_err, best = float("inf"), torch.ones_like(x_mean)
    for i in range(grid):
        s = x_mean.pow(i / grid).clamp_min(1e-4)
        s = s / (s.max() * s.min()).sqrt()
        err = float((x @ (fake_quantize(w * s, group_size) / s).t() - reference).pow(2).mean())
        if err < best_err:
            best_err, best = err, s
    return best


def apply_awq_scales(weights: dict[str, torch.Tensor], calibration: dict[str, torch.Tensor],
                     targets: list[str], group_size: int) -> dict[str, torch.Tensor]:
    """Scaled copies of the tensors the search changes (consumers' columns up, producers' rows down)."""
    out = {}
    get = lambda name: out.get(name, weights[name])  # noqa: E731  (a fold may touch a tensor twice)
    for layer in sorted({t.rsplit(".", 2)[0] for t in targets if t.count(".") >= 2}):
        for producer, consumers in FOLDS:
            producer_name = f"{layer}.{producer}"
            names = [f"{layer}.{c}" for c in consumers]
            if producer_name not in weights or not all(n in targets and n in calibration for n in names):
                continue
            consumer_w = [get(f"{n}.weight") for n in names]
            if get(producer_name).shape[0] != consumer_w[0].shape[1]:
                continue  # v_proj -> o_proj with grouped KV heads: channels do not line up
            s = search_scale(calibration[names[0]], consumer_w, group_size)
            p = get(producer_name).float()
            out[producer_name] = (p / (s if p.dim() == 1 else s[:, None])).to(weights[producer_name].dtype)
            for n, w in zip(names, consumer_w):
                out[f"{n}.weight"] = (w.float() * s).to(w.dtype)
    return out
