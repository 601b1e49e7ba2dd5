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


# ---- an upcycled SmolLM2: a real pretrained model whose MLPs become MoE blocks ------------------
SPARSE_LAYERS = (2, 14, 27)


def upcycle_smollm2(dense: Path, target: Path, num_experts: int = 4, seed: int = 0) -> Path:
    """Qwen2-MoE checkpoint from SmolLM2: zero qkv bias (same attention), MoE blocks on ``SPARSE_LAYERS``.

    Each expert is the dense MLP with perturbed weights and half its output; the shared expert is the
    dense MLP behind a zero gate (sigmoid(0) = 1/2); renormalised top-2 routing on a random router, so
    the block stays close to the dense MLP while the choice of experts changes the result.
    """
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, Qwen2MoeConfig

    dense_cfg = AutoConfig.from_pretrained(dense)
    keep = {k: getattr(dense_cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                               "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                                               "max_position_embeddings", "bos_token_id", "eos_token_id", "rope_parameters")}
    cfg = Qwen2MoeConfig(**keep, moe_intermediate_size=dense_cfg.intermediate_size, tie_word_embeddings=True,
                         shared_expert_intermediate_size=dense_cfg.intermediate_size, num_experts=num_experts,
                         num_experts_per_tok=2, norm_topk_prob=True, architectures=["Qwen2MoeForCausalLM"],
                         mlp_only_layers=[i for i in range(dense_cfg.num_hidden_layers) if i not in SPARSE_LAYERS])
    tensors, g = load_file(str(dense / "model.safetensors")), torch.Generator().manual_seed(seed)
    for i in range(cfg.num_hidden_layers):
        attn = f"model.layers.{i}.self_attn"
        for proj in ("q_proj", "k_proj", "v_proj"):
            tensors[f"{attn}.{proj}.bias"] = torch.zeros(tensors[f"{attn}.{proj}.weight"].shape[0])
        if i in SPARSE_LAYERS:
            mlp = f"model.layers.{i}.mlp"
            dense_mlp = {p: tensors.pop(f"{mlp}.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")}
            for p, w in dense_mlp.items():
                tensors[f"{mlp}.shared_expert.{p}.weight"] = w
                for e in range(num_experts):
                    noisy = w * (1 + 0.3 * torch.randn(w.shape, generator=g))
                    tensors[f"{mlp}.experts.{e}.{p}.weight"] = noisy * (0.5 if p == "down_proj" else 1.0)
            tensors[f"{mlp}.shared_expert_gate.weight"] = torch.zeros(1, cfg.hidden_size)
            tensors[f"{mlp}.gate.weight"] = torch.randn(num_experts, cfg.hidden_size, generator=g) * 0.1
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(target)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (dense / f).is_file():
            shutil.copy(dense / f, target / f)
    return target


@pytest.fixture(scope="module")
def upcycled(tmp_path_factory):
    from nanocore.loader.default_model import default_model_path

    path = upcycle_smollm2(default_model_path(), tmp_path_factory.mktemp("smollm2_moe"))
    return hf_model(path), load_model(EngineConfig(model=str(path), device="cpu"), "cpu")


@pytest.mark.slow
def test_upcycled_smollm2_matches_transformers_and_still_knows_paris(upcycled):
    ref, loaded = upcycled
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    ours = nanocore_greedy(loaded.model, prompt, 32)
    assert ours == hf_greedy(ref, prompt, 32)
    assert "Paris" in loaded.tokenizer.decode(ours[:4])
    with torch.no_grad():
        theirs = ref(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(nanocore_logits(loaded.model, [prompt]), theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_upcycled_smollm2_routing_matters(upcycled):
    """Forcing every token to the same two experts changes the logits: the router is doing work."""
    _, loaded = upcycled
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    routed = nanocore_logits(loaded.model, [prompt])
    block = loaded.model.model.layers[SPARSE_LAYERS[0]].mlp
    saved = block.gate.weight.data.clone()
    try:
        block.gate.weight.data.zero_()  # equal logits: every token gets the same two experts
        fixed = nanocore_logits(loaded.model, [prompt])
    finally:
        block.gate.weight.data.copy_(saved)
    assert (routed - fixed).abs().max() > 1e-2
