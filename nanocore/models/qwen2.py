"""Qwen2 / Qwen2.5: the Llama decoder with a bias on the q, k and v projections."""
from __future__ import annotations

from nanocore.models.decoder import DecoderForCausalLM, DecoderOptions


class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def decoder_options(cls, cfg) -> DecoderOptions:
        return DecoderOptions(qkv_bias=True)
