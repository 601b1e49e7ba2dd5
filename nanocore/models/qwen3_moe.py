"""Qwen3-MoE: the Qwen3 decoder (per-head q/k RMSNorm) with sparse MoE MLPs and no shared expert."""
from __future__ import annotations

from nanocore.models.decoder import DecoderOptions
from nanocore.models.qwen2_moe import MoEDecoderForCausalLM


class Qwen3MoeForCausalLM(MoEDecoderForCausalLM):
    @classmethod
    def decoder_options(cls, cfg) -> DecoderOptions:
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        return DecoderOptions(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True)
