"""Checkpoint loading: sharded safetensors, damaged checkpoints, dummy presets, backend choice."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint, nanocore_logits, tiny_config
from nanocore.config import EngineConfig
from nanocore.loader import list_presets, load_model, preset_config, resolve_dtype
from nanocore.models import CheckpointError

SEQS = [[5, 17, 200, 3, 99, 42, 7]]


def _load(path, **kwargs):
    return load_model(EngineConfig(model=str(path), device="cpu", **kwargs), "cpu")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("single"), "qwen2")


@pytest.fixture()
def sharded(tmp_path):
    from transformers import AutoModelForCausalLM

    src = make_checkpoint(tmp_path / "src", "qwen2")
    AutoModelForCausalLM.from_pretrained(src).save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    (tmp_path / "sharded" / "generation_config.json").write_text((src / "generation_config.json").read_text())
    return tmp_path / "sharded"


def test_sharded_checkpoint_equals_single_file(single, sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    torch.testing.assert_close(nanocore_logits(_load(sharded).model, SEQS), nanocore_logits(_load(single).model, SEQS))


def test_missing_shard_names_the_file(sharded):
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard.name}.*missing.*download"):
        _load(sharded)


def test_truncated_file_is_a_clear_error(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated or corrupt"):
        _load(path)


def _rewrite(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*layers\.1\.self_attn\.qkv_proj\.weight\[k\]"):
        _load(path)


def test_unexpected_tensor_is_named(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    _rewrite(path, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="'model.layers.0.mlp.extra.weight' has no matching parameter"):
        _load(path)


def test_wrong_shape_is_named(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    _rewrite(path, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight'.*\(65,\).*\(64,\)"):
        _load(path)


def test_quantized_checkpoint_without_plugin(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "imaginary-q3"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method 'imaginary-q3'.*no installed linear method.*plugin"):
        _load(path)
    with pytest.raises(ValueError, match="linear_method 'unquantized' cannot load .*loads 'unquantized' checkpoints"):
        _load(path, linear_method="unquantized")


def test_eos_ids_from_generation_config_then_config(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert _load(path).eos_token_ids == [7, 2]


def test_max_model_len(single):
    assert _load(single, max_model_len=100).max_model_len == 100
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 256"):
        _load(single, max_model_len=1000)


def test_dtype_auto():
    cfg = tiny_config("llama", dtype="bfloat16")
    assert resolve_dtype("auto", cfg, torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", cfg, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", cfg, torch.device("cpu")) == torch.float16


def test_bad_model_names():
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder.*dummy:PRESET"):
        load_model(EngineConfig(model="/nonexistent/model", device="cpu"), "cpu")
    with pytest.raises(ValueError, match="unknown preset 'Nope-1B'.*Qwen3-0.6B"):
        load_model(EngineConfig(model="dummy:Nope-1B", device="cpu"), "cpu")


def test_presets_parse_with_real_shapes():
    assert {"Qwen3-0.6B", "Qwen2.5-7B", "Llama-3.1-8B", "Qwen1.5-MoE-A2.7B", "Qwen3-30B-A3B"} <= set(list_presets())
    llama = preset_config("Llama-3.1-8B")
    assert llama.architectures == ["LlamaForCausalLM"] and llama.hidden_size == 4096
    assert preset_config("Qwen2.5-7B").num_key_value_heads == 4
    assert preset_config("Qwen3-30B-A3B").num_experts == 128


def test_moe_presets_describe_real_models():
    qwen15 = preset_config("Qwen1.5-MoE-A2.7B")
    assert qwen15.architectures == ["Qwen2MoeForCausalLM"]
    assert (qwen15.num_experts, qwen15.num_experts_per_tok, qwen15.moe_intermediate_size) == (60, 4, 1408)
    assert preset_config("Qwen3-30B-A3B").num_experts_per_tok == 8


def test_dummy_qwen3_0_6b_builds_fast_and_runs():
    start = time.perf_counter()
    loaded = load_model(EngineConfig(model="dummy:Qwen3-0.6B", device="cpu", seed=3), "cpu")
    assert time.perf_counter() - start < 60
    assert loaded.model.kv_cache_spec == (28, 8, 128) and loaded.tokenizer is None
    logits = nanocore_logits(loaded.model, [[1, 2, 3, 4]])
    assert logits.shape == (4, 151936) and torch.isfinite(logits).all()
    emb = loaded.model.model.embed_tokens.weight
    assert 0.015 < emb[:1000].std().item() < 0.025  # seeded N(0, 0.02)


# ---- damaged metadata: a CheckpointError naming the file, not a traceback from transformers / json -----------
@pytest.mark.parametrize("text, message", [
    ("{not json", "not a valid JSON"), ("", "not a valid JSON"),
    ('{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": "64"}', "hidden_size"),
])
def test_unreadable_config_json_is_a_checkpoint_error(tmp_path, text, message):
    path = make_checkpoint(tmp_path, "qwen2")
    (path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=rf"cannot read .*config\.json: .*{message}.*fix the file"):
        _load(path)


def test_non_positive_max_position_embeddings_is_an_error(tmp_path):
    path = make_checkpoint(tmp_path, "qwen2", max_position_embeddings=0)
    with pytest.raises(ValueError, match="max_position_embeddings 0; it must be a positive integer"):
        _load(path)  # was accepted: max_model_len 0, every request then refused


def test_broken_generation_config_is_named(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    (path / "generation_config.json").write_text("{bad")
    with pytest.raises(CheckpointError, match="generation_config.json is not valid JSON"):
        _load(path)


def test_index_whose_weight_map_is_not_a_mapping(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    with pytest.raises(CheckpointError, match="not a valid safetensors index.*weight_map"):
        _load(path)  # was an AttributeError


def test_missing_tokenizer_folder_is_named(single, tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer folder /nonexistent/tok does not exist"):
        _load(single, tokenizer="/nonexistent/tok")  # was an OSError about Hugging Face repo ids
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="tokenizer.json is a file, not a folder"):
        _load(single, tokenizer=str(tmp_path / "tokenizer.json"))


def test_config_error_keeps_the_reason_on_later_lines(tmp_path):
    """transformers puts the cause of a validation error on its second line."""
    path = make_checkpoint(tmp_path, "qwen2")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": None}))
    with pytest.raises(ValueError, match="max_position_embeddings") as caught:  # CheckpointError is one too
        _load(path)
    if isinstance(caught.value, CheckpointError):  # transformers refused it: its reason must survive
        assert "expected int" in str(caught.value) or "NoneType" in str(caught.value), str(caught.value)


def test_quantized_method_on_an_unquantized_checkpoint_says_quantize_first(single):
    with pytest.raises(ValueError, match="linear_method 'awq' loads 'awq' checkpoints but .* is not quantized.*"
                                         "nanocore quantize --method awq"):
        _load(single, linear_method="awq")  # was "input size ... not a multiple of group_size 128"
