"""Loading a checkpoint made by `nanocore quantize --ignore`: the ignored layers are built `unquantized`."""
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint, nanocore_logits
from nanocore.cli.main import main
from nanocore.config import EngineConfig
from nanocore.loader import load_model

#: (method, plugin module, key under which the method's quantization_config lists ignored layers)
METHODS = [("fp8_w8a16", "nanocore_fp8", "ignore"), ("int8_w8a8", "nanocore_int8", "ignore"),
           ("awq", "nanocore_awq", "modules_to_not_convert"), ("wna16", "nanocore_awq", "ignore")]
SEQS = [[5, 17, 200, 3, 99, 42, 7]]


def _quantize(tmp_path, method, *ignore, extra=()):
    src = tmp_path / "src"
    if not src.exists():
        make_checkpoint(src, "llama")
    dst = tmp_path / f"{method}-{len(list(tmp_path.iterdir()))}"
    args = ["quantize", "--method", method, "--model", str(src), "--out", str(dst), *extra]
    for pattern in ignore:
        args += ["--ignore", pattern]
    assert main(args) == 0
    return src, dst


def _load(path, **kwargs):
    return load_model(EngineConfig(model=str(path), device="cpu", **kwargs), "cpu").model


@pytest.mark.parametrize("method,module,key", METHODS)
def test_ignored_layer_is_built_unquantized(tmp_path, method, module, key):
    pytest.importorskip(module, reason=f"needs the {module} plugin (pip install -e plugins_quant/...)")
    extra = ["--group-size", "64"] if method in ("awq", "wna16") else []
    src, dst = _quantize(tmp_path, method, "model.layers.1.mlp.down_proj", extra=extra)
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.mlp.down_proj" in config[key]

    model = _load(dst)
    layers = model.model.layers
    ignored = layers[1].mlp.down_proj
    assert ignored.linear_method.name == "unquantized"
    source = load_file(str(src / "model.safetensors"))
    torch.testing.assert_close(ignored.weight, source["model.layers.1.mlp.down_proj.weight"], rtol=0, atol=0)
    for layer in (layers[0].mlp.down_proj, layers[1].mlp.gate_up_proj, layers[1].self_attn.qkv_proj):
        assert layer.linear_method.name != "unquantized"  # the rest stays quantized
    assert torch.isfinite(nanocore_logits(model, SEQS)).all()


def test_merged_layer_is_unquantized_when_all_its_shards_are_ignored(tmp_path):
    pytest.importorskip("nanocore_fp8")
    _, dst = _quantize(tmp_path, "fp8_w8a16", "re:model\\.layers\\.0\\.self_attn\\.[qkv]_proj")
    model = _load(dst)
    assert model.model.layers[0].self_attn.qkv_proj.linear_method.name == "unquantized"
    assert model.model.layers[0].self_attn.o_proj.linear_method.name != "unquantized"
    assert model.model.layers[1].self_attn.qkv_proj.linear_method.name != "unquantized"
    assert torch.isfinite(nanocore_logits(model, SEQS)).all()


def test_part_of_a_merged_layer_ignored_is_a_clear_error(tmp_path):
    pytest.importorskip("nanocore_fp8")
    _, dst = _quantize(tmp_path, "fp8_w8a16", "model.layers.0.mlp.gate_proj")
    with pytest.raises(ValueError, match="gate_proj.*merged layer model.layers.0.mlp.gate_up_proj"):
        _load(dst)


def test_ignored_layer_matches_the_float_model(tmp_path):
    """Every decoder linear ignored: the float model's logits; none ignored: different logits."""
    pytest.importorskip("nanocore_int8")
    src, all_q = _quantize(tmp_path, "int8_w8a8")
    _, some_q = _quantize(tmp_path, "int8_w8a8", "re:model\\.layers\\.\\d+\\.(mlp|self_attn)\\..*")
    reference = nanocore_logits(_load(src), SEQS)
    everything_ignored = nanocore_logits(_load(some_q), SEQS)
    torch.testing.assert_close(everything_ignored, reference, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(nanocore_logits(_load(all_q), SEQS), reference, rtol=1e-5, atol=1e-5)


def test_int8_w8a16_loads_its_own_checkpoint_by_name(tmp_path):
    """Both int8 methods read compressed-tensors checkpoints; 'auto' prefers int8_w8a8 (checkpoint_priority)."""
    from nanocore.loader.model_loader import resolve_linear_method

    from nanocore_int8.config import compressed_tensors_config

    hf_config = type("Cfg", (), {"quantization_config": compressed_tensors_config("dynamic")})()
    by_name, _ = resolve_linear_method("int8_w8a16", {}, hf_config, torch.device("cpu"))
    automatic, options = resolve_linear_method("auto", {}, hf_config, torch.device("cpu"))
    assert by_name.name == "int8_w8a16" and automatic.name == "int8_w8a8"
    assert options["quantization_config"]["quant_method"] == "compressed-tensors"
