"""Qwen2-MoE and Qwen3-MoE against transformers on tiny random checkpoints (fp32, CPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import hf_greedy, hf_model, nanocore_greedy, nanocore_logits
from nanocore.config import EngineConfig
from nanocore.loader import load_model
from nanocore.models import CheckpointError

TINY_MOE = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0, num_experts=8,
                num_experts_per_tok=2, tie_word_embeddings=False)


def tiny_moe_config(kind: str):
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    if kind == "qwen2_moe":  # shared expert; layer 1 dense; softmax weights not renormalised
        return Qwen2MoeConfig(**TINY_MOE, shared_expert_intermediate_size=48, mlp_only_layers=[1],
                              norm_topk_prob=False, architectures=["Qwen2MoeForCausalLM"])
    # Qwen3-MoE: head_dim != hidden / heads, every other layer sparse, renormalised top-k
    return Qwen3MoeConfig(**TINY_MOE, head_dim=32, decoder_sparse_step=2, norm_topk_prob=True,
                          architectures=["Qwen3MoeForCausalLM"])


def make_moe_checkpoint(path: Path, kind: str, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_moe_config(kind), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.2)
            elif name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.5)  # decisive, input-dependent routing
            else:
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    return Path(path)


@pytest.fixture(scope="module", params=["qwen2_moe", "qwen3_moe"])
def pair(request, tmp_path_factory):
    path = make_moe_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, path, hf_model(path), load_model(EngineConfig(model=str(path), device="cpu"), "cpu")


def test_logits_match_transformers(pair):
    _, _, ref, loaded = pair
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (29, 1, 40)]
    ours = nanocore_logits(loaded.model, seqs)
    with torch.no_grad():
        theirs = torch.cat([ref(torch.tensor([s])).logits[0] for s in seqs])
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_greedy_continuation_matches_generate(pair):
    _, _, ref, loaded = pair
    prompt = torch.randint(3, 256, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    assert nanocore_greedy(loaded.model, prompt, 32) == hf_greedy(ref, prompt, 32)


def test_structure_follows_the_config(pair):
    kind, _, _, loaded = pair
    layers = loaded.model.model.layers
    sparse = [hasattr(layer.mlp, "experts") for layer in layers]
    assert sparse == ([True, False, True] if kind == "qwen2_moe" else [False, True, False])
    block = next(layer.mlp for layer in layers if hasattr(layer.mlp, "experts"))
    assert block.experts.w13.shape == (8, 64, 64) and block.experts.w2.shape == (8, 64, 32)
    assert (block.shared_expert is not None) == (kind == "qwen2_moe")
    assert type(loaded.moe_executor).__name__ == "EagerMoEExecutor"


def test_missing_expert_is_reported(pair, tmp_path):
    from safetensors.torch import load_file, save_file

    kind, path, _, _ = pair
    tensors = load_file(str(path / "model.safetensors"))
    layer = 0 if kind == "qwen2_moe" else 1
    del tensors[f"model.layers.{layer}.mlp.experts.5.up_proj.weight"]
    for f in ("config.json", "generation_config.json"):
        (tmp_path / f).write_text((path / f).read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"experts.w13\[5.w3\]"):
        load_model(EngineConfig(model=str(tmp_path), device="cpu"), "cpu")
