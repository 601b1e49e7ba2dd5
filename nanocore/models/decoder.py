"""The Llama-family decoder every dense model here is a parameterisation of.

    embed -> N x [ RMSNorm -> attention (qkv, optional per-head q/k RMSNorm, RoPE) -> + residual
                   RMSNorm -> MLP (gate_up, SiLU*mul, down) -> + residual ] -> RMSNorm -> LM head

Under pipeline parallelism a rank builds only its stage (``distributed.pipeline.stage_layers``): its layers, the
embedding on the first stage, the norm and LM head on the last; the others stay ``MissingLayer`` / None.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import islice

import torch
from torch import nn

from nanocore.distributed.pipeline import stage_layers
from nanocore.layers.activation import get_gated_activation
from nanocore.layers.attention import Attention, AttentionMetadata
from nanocore.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.layers.norm import RMSNorm
from nanocore.layers.rotary import RotaryEmbedding, build_rope
from nanocore.models.base import CausalLMBase, ModelBuildContext


@dataclass(frozen=True)
class DecoderOptions:
    """Where the architectures differ."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE


def head_dim_of(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def linear_kwargs(build: ModelBuildContext, prefix: str) -> dict:
    return dict(linear_method=build.linear_method_factory(prefix), parallel=build.parallel,
                params_dtype=build.dtype, prefix=prefix)


class DecoderAttention(nn.Module):
    def __init__(self, cfg, build: ModelBuildContext, opts: DecoderOptions, rope: RotaryEmbedding,
                 layer_idx: int, prefix: str):
        super().__init__()
        head_dim = head_dim_of(cfg)
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=opts.qkv_bias,
                                          **linear_kwargs(build, f"{prefix}.qkv_proj"))
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * head_dim, cfg.hidden_size, bias=opts.o_bias,
                                        **linear_kwargs(build, f"{prefix}.o_proj"))
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_norm = RMSNorm(head_dim, cfg.rms_norm_eps, build.dtype) if opts.qk_norm else None
        self.k_norm = RMSNorm(head_dim, cfg.rms_norm_eps, build.dtype) if opts.qk_norm else None
        self.rotary_emb = rope
        self.attn = Attention(self.num_heads, self.num_kv_heads, head_dim, head_dim ** -0.5, layer_idx)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        # per-head q / k RMSNorm (Qwen3) and RoPE in one launch on CUDA; v stays a view (the store takes strides)
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm)
        return self.o_proj(self.attn(q, k, v, meta))


class GatedMLP(nn.Module):
    def __init__(self, cfg, build: ModelBuildContext, opts: DecoderOptions, prefix: str,
                 intermediate_size: int | None = None):
        super().__init__()
        intermediate = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [intermediate] * 2, bias=opts.mlp_bias,
                                                       **linear_kwargs(build, f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(intermediate, cfg.hidden_size, bias=opts.mlp_bias,
                                           **linear_kwargs(build, f"{prefix}.down_proj"))
        self.act_fn = get_gated_activation(getattr(cfg, "hidden_act", "silu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, build: ModelBuildContext, opts: DecoderOptions, rope: RotaryEmbedding,
                 mlp: nn.Module, layer_idx: int, prefix: str):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build.dtype)
        self.self_attn = DecoderAttention(cfg, build, opts, rope, layer_idx, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build.dtype)
        self.mlp = mlp

    def forward(self, positions, hidden, residual, meta):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class MissingLayer(nn.Module):
    """A decoder layer that another pipeline stage holds (keeps the checkpoint's layer numbering)."""


class DecoderModel(nn.Module):
    def __init__(self, cfg, build: ModelBuildContext, opts: DecoderOptions, make_mlp, prefix: str = "model"):
        super().__init__()
        self.stage = stage = stage_layers(cfg.num_hidden_layers, build.parallel.pp_size, build.parallel.pp_rank)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, parallel=build.parallel,
                                                   params_dtype=build.dtype) if stage.is_first else None
        rope = build_rope(cfg, head_dim_of(cfg))  # one cos/sin table shared by all layers
        self.layers = nn.ModuleList(  # attention indexes the stage's own KV caches: local layer numbers
            DecoderLayer(cfg, build, opts, rope, make_mlp(f"{prefix}.layers.{i}.mlp", i), i - stage.start,
                         f"{prefix}.layers.{i}") if i in stage else MissingLayer()
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build.dtype) if stage.is_last else None

    def forward(self, input_ids, positions, meta, carried=None):
        """The final hidden states; on a stage before the last, ``(hidden, residual)`` for the next stage, which
        passes them back as ``carried`` (the first stage embeds ``input_ids`` instead)."""
        hidden, residual = (self.embed_tokens(input_ids), None) if carried is None else carried
        for layer in islice(self.layers, self.stage.start, self.stage.end):  # a ModuleList slice costs 0.25 ms
            hidden, residual = layer(positions, hidden, residual, meta)
        if self.norm is None:
            return hidden, residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class DecoderForCausalLM(CausalLMBase):
    """A Llama-family causal LM; subclasses choose ``decoder_options`` and, for MoE, ``make_mlp``."""

    stacked_params = [
        ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
    ]

    @classmethod
    def decoder_options(cls, cfg) -> DecoderOptions:
        raise NotImplementedError

    def __init__(self, cfg, build: ModelBuildContext):
        super().__init__()
        self.config, self.build = cfg, build
        self.options = self.decoder_options(cfg)
        self.model = DecoderModel(cfg, build, self.options, self.make_mlp)
        self.stage = stage = self.model.stage
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, parallel=build.parallel,
                                      params_dtype=build.dtype) if stage.is_last else None
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        if self.tie_word_embeddings and stage.is_first and stage.is_last:
            self.lm_head.tie_to(self.model.embed_tokens)

    def make_mlp(self, prefix: str, layer_idx: int) -> nn.Module:
        return GatedMLP(self.config, self.build, self.options, prefix)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                carried: tuple[torch.Tensor, torch.Tensor] | None = None):
        return self.model(input_ids, positions, meta, carried)

    def holds(self, hf_name: str) -> bool:
        """Whether this pipeline stage holds checkpoint tensor ``hf_name`` (the other stages load the rest)."""
        stage, layer = self.stage, _LAYER.match(hf_name)
        if layer:
            return int(layer.group(1)) in stage
        if hf_name.startswith("model.embed_tokens."):  # a tied LM head on the last stage loads it too
            return stage.is_first or (self.tie_word_embeddings and stage.is_last)
        if hf_name.startswith(("model.norm.", "lm_head.")):
            return stage.is_last
        return True

    def map_name(self, hf_name: str) -> tuple[str, tuple]:
        if hf_name == "model.embed_tokens.weight" and self.model.embed_tokens is None:  # the last stage's tied head
            return "lm_head.weight", ()
        return super().map_name(hf_name)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    @property
    def kv_cache_spec(self) -> tuple[int, int, int]:
        """(layers, KV heads, head dim) of this stage's KV cache."""
        attn = self.model.layers[self.stage.start].self_attn
        return self.stage.end - self.stage.start, attn.num_kv_heads, attn.head_dim


_LAYER = re.compile(r"model\.layers\.(\d+)\.")
