"""Llama (2, 3, 3.1, SmolLM2, ...): the plain decoder, biases only where config.json asks."""
from __future__ import annotations

from nanocore.models.decoder import DecoderForCausalLM, DecoderOptions


class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def decoder_options(cls, cfg) -> DecoderOptions:
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        return DecoderOptions(qkv_bias=attention_bias, o_bias=attention_bias,
                              mlp_bias=bool(getattr(cfg, "mlp_bias", False)))
