"""nanocore models against transformers on tiny random checkpoints (fp32, CPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import hf_greedy, hf_model, make_checkpoint, nanocore_greedy, nanocore_logits, tiny_config
from nanocore.config import EngineConfig
from nanocore.distributed import ParallelContext
from nanocore.layers.rotary import RotaryEmbedding
from nanocore.loader import load_model
from nanocore.models import ModelBuildContext, build_model

KINDS = ["llama", "llama_tied", "llama3_rope", "qwen2", "qwen3"]


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, hf_model(path), load_model(EngineConfig(model=str(path), device="cpu"), "cpu")


def test_logits_match_transformers(pair):
    kind, ref, loaded = pair
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (37, 5, 64)]
    ours = nanocore_logits(loaded.model, seqs)  # one mixed batch: positions restart per sequence
    with torch.no_grad():
        theirs = torch.cat([ref(torch.tensor([s])).logits[0] for s in seqs])
    assert ours.dtype == torch.float32 and ours.shape == (sum(map(len, seqs)), 256)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_greedy_continuation_matches_generate(pair):
    kind, ref, loaded = pair
    prompt = torch.randint(3, 256, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    assert nanocore_greedy(loaded.model, prompt, 32) == hf_greedy(ref, prompt, 32)


def test_loaded_model_fields(pair):
    kind, _, loaded = pair
    assert loaded.eos_token_ids == [2] and loaded.max_model_len == 256
    assert loaded.linear_method == "unquantized" and loaded.moe_executor is None
    assert loaded.dtype == torch.float32 and loaded.tokenizer is None
    head_dim = 32 if kind == "qwen3" else 16
    assert loaded.model.kv_cache_spec == (2, 2, head_dim)
    tied = loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    assert tied == (kind == "llama_tied")


def test_llama3_rope_scaling_changes_long_positions():
    theta = 10000.0
    plain = RotaryEmbedding(16, 256, theta)
    scaled = RotaryEmbedding(16, 256, theta, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    assert not torch.allclose(plain.cos_sin_cache[200], scaled.cos_sin_cache[200])
    # the highest frequency is left alone
    assert torch.equal(plain.cos_sin_cache[:, 0], scaled.cos_sin_cache[:, 0])


def _build_ctx():
    from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod

    return ModelBuildContext(dtype=torch.float32, device=torch.device("cpu"), parallel=ParallelContext(),
                             linear_method_factory=lambda prefix: UnquantizedLinearMethod())


def test_unsupported_rope_type_is_a_clear_error():
    cfg = tiny_config("llama")
    cfg.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported.*llama3"):
        build_model(cfg, _build_ctx())


def test_unknown_architecture_lists_supported():
    cfg = tiny_config("llama")
    cfg.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM"):
        build_model(cfg, _build_ctx())
