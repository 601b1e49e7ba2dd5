"""Tiny random Hugging Face checkpoints for model, loader and tensor-parallel tests."""
from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 10000.0}


def tiny_config(kind: str, **overrides):
    """A transformers config for ``kind`` in llama, llama_tied, llama3_rope, qwen2, qwen3."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    args = dict(TINY, tie_word_embeddings=False)
    if kind == "llama":
        cls = LlamaConfig
    elif kind == "llama_tied":
        cls, args["tie_word_embeddings"] = LlamaConfig, True
    elif kind == "llama3_rope":
        cls, args["rope_parameters"] = LlamaConfig, dict(LLAMA3_ROPE)
    elif kind == "qwen2":
        cls = Qwen2Config
    elif kind == "qwen3":
        cls, args["head_dim"] = Qwen3Config, 32  # head_dim != hidden / heads, as in real Qwen3
    else:
        raise ValueError(kind)
    args["architectures"] = [cls.__name__.replace("Config", "ForCausalLM")]
    args.update(overrides)
    return cls(**args)


def make_checkpoint(path: Path, kind: str, seed: int = 0, **overrides) -> Path:
    """Save a random-weight HF model of ``kind`` (safetensors, fp32) into ``path``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(kind, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)  # non-trivial norms catch a missing weight multiply
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.2)  # non-zero qkv bias (Qwen2)
    model.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    return Path(path)


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def nanocore_logits(model, token_ids: list[list[int]]) -> torch.Tensor:
    """Logits of every position of every sequence (one batch, no KV cache), concatenated."""
    from nanocore.layers.attention import AttentionMetadata

    input_ids = torch.tensor([t for seq in token_ids for t in seq])
    positions = torch.cat([torch.arange(len(seq)) for seq in token_ids])
    with torch.no_grad():
        hidden = model(input_ids, positions, AttentionMetadata.for_prefill([len(s) for s in token_ids]))
        return model.compute_logits(hidden)


def nanocore_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation, recomputing the whole prefix each step (no KV cache)."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        tokens.append(int(nanocore_logits(model, [tokens])[-1].argmax()))
    return tokens[len(prompt):]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    model.generation_config.eos_token_id = None  # never stop early: compare every token
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()
