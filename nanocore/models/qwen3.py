"""Qwen3: the Llama decoder with RMSNorm over each head of q and k (no qkv bias by default)."""
from __future__ import annotations

from nanocore.models.decoder import DecoderForCausalLM, DecoderOptions


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def decoder_options(cls, cfg) -> DecoderOptions:
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        return DecoderOptions(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True)
