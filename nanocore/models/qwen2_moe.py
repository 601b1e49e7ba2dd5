"""Qwen2-MoE (Qwen1.5-MoE): the Qwen2 decoder whose MLP is a sparse MoE block plus a gated shared expert.

    x -> router softmax top-k -> routed experts (FusedMoE: prepare/finalize + MoEExecutor)
      + sigmoid(shared_expert_gate x) * shared_expert(x)     (on a side CUDA stream, concurrently)

Layers listed in ``mlp_only_layers`` (or off the ``decoder_sparse_step`` grid) keep a dense MLP.
"""
from __future__ import annotations

import torch
from torch import nn

from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.layers import moe as moe_layer
from nanocore.layers.moe import FusedMoE, Router, StreamOverlap, match_expert_weight
from nanocore.models.decoder import DecoderForCausalLM, DecoderOptions, GatedMLP


class SparseMoeBlock(nn.Module):
    """Router + routed experts, and the shared expert with its sigmoid gate when the config has one.

    ``overlap`` runs the gated shared expert on a side CUDA stream beside router + routed experts
    (default: ``shared_expert_overlap(build)``); ``overlap.enabled = False`` makes it sequential.
    """

    def __init__(self, cfg, build, opts: DecoderOptions, prefix: str, overlap: StreamOverlap | None = None):
        super().__init__()
        self.overlap = overlap if overlap is not None else shared_expert_overlap(build)
        self.gate = Router(cfg.hidden_size, cfg.num_experts, build.dtype)
        self.experts = FusedMoE(
            cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size,
            executor=build.moe_executor or EagerMoEExecutor(), parallel=build.parallel,
            renormalize=bool(getattr(cfg, "norm_topk_prob", False)), params_dtype=build.dtype,
            activation=getattr(cfg, "hidden_act", "silu"),
            weight_format=build.moe_weight_format(f"{prefix}.experts") if build.moe_weight_format else "float",
        )
        shared = getattr(cfg, "shared_expert_intermediate_size", 0) or 0
        self.shared_expert = GatedMLP(cfg, build, opts, f"{prefix}.shared_expert", shared) if shared else None
        self.shared_expert_gate = Router(cfg.hidden_size, 1, build.dtype) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared_expert is None:
            return self.experts(x, self.gate(x))
        routed, shared = self.overlap.run(x.device, lambda: self.experts(x, self.gate(x)),
                                          lambda: self.gated_shared_expert(x))
        return routed + shared

    def gated_shared_expert(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


def shared_expert_overlap(build) -> StreamOverlap:
    """The engine's choice (``build.moe_shared_expert_overlap``, else the module default), sequential under TP.

    Under TP both branches end in an all-reduce on one communicator; that pair is untested on two
    concurrent streams inside graph capture, so it stays sequential until measured on several GPUs.
    """
    enabled = build.moe_shared_expert_overlap
    enabled = moe_layer.SHARED_EXPERT_OVERLAP if enabled is None else enabled  # the module default, read now
    return StreamOverlap(enabled and build.parallel.tp_size == 1)


def is_sparse_layer(cfg, layer_idx: int) -> bool:
    """HF's rule: not in ``mlp_only_layers`` and on the ``decoder_sparse_step`` grid."""
    mlp_only = getattr(cfg, "mlp_only_layers", None) or []
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    return layer_idx not in mlp_only and cfg.num_experts > 0 and (layer_idx + 1) % step == 0


class MoEDecoderForCausalLM(DecoderForCausalLM):
    """A Llama-family decoder with sparse MoE MLPs; per-expert checkpoint tensors load into w13 / w2."""

    def make_mlp(self, prefix: str, layer_idx: int) -> nn.Module:
        if not is_sparse_layer(self.config, layer_idx):
            return GatedMLP(self.config, self.build, self.options, prefix)
        if getattr(self, "shared_expert_overlap", None) is None:  # one side stream for all layers: they run in turn
            self.shared_expert_overlap = shared_expert_overlap(self.build)
        return SparseMoeBlock(self.config, self.build, self.options, prefix, overlap=self.shared_expert_overlap)

    def map_name(self, hf_name: str) -> tuple[str, tuple]:
        expert = match_expert_weight(hf_name)
        if expert is not None:
            name, expert_id, shard_id = expert
            return name, (expert_id, shard_id)
        return super().map_name(hf_name)

    def _loaded_keys(self, name: str, loader_args: tuple) -> set[str]:
        if len(loader_args) == 2:  # one expert's shard: track it so a missing expert is reported
            return {f"{name}[{loader_args[0]}.{loader_args[1]}]"}
        return super()._loaded_keys(name, loader_args)

    def expected_weight_keys(self) -> set[str]:
        keys = super().expected_weight_keys()
        for prefix, module in self.named_modules():
            if isinstance(module, FusedMoE):
                for param in module.expert_weights.param_names():  # w13, w2 (+ w13_scale, w2_scale for fp8)
                    keys.discard(f"{prefix}.{param}")
                    shards = ("w2",) if param.startswith("w2") else ("w1", "w3")
                    keys |= {f"{prefix}.{param}[{e}.{s}]" for e in range(module.num_experts) for s in shards}
        return keys


class Qwen2MoeForCausalLM(MoEDecoderForCausalLM):
    @classmethod
    def decoder_options(cls, cfg) -> DecoderOptions:
        return DecoderOptions(qkv_bias=bool(getattr(cfg, "qkv_bias", True)))
