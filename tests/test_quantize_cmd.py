"""`nanocore quantize`: output format, the source left untouched, no half-written DST on interruption."""
import hashlib
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nanocore.cli import quantize_cmd
from nanocore.cli.main import main

pytest.importorskip("nanocore_fp8", reason="needs the nanocore-fp8 plugin (pip install -e plugins_quant/fp8_w8a16)")


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    h, i = 64, 128
    tensors = {"model.embed_tokens.weight": torch.randn(100, h), "model.norm.weight": torch.ones(h)}
    for n in range(2):
        p = f"model.layers.{n}."
        tensors |= {p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                    p + "self_attn.q_proj.weight": torch.randn(h, h), p + "self_attn.k_proj.weight": torch.randn(32, h),
                    p + "self_attn.v_proj.weight": torch.randn(32, h), p + "self_attn.o_proj.weight": torch.randn(h, h),
                    p + "mlp.gate_proj.weight": torch.randn(i, h), p + "mlp.up_proj.weight": torch.randn(i, h),
                    p + "mlp.down_proj.weight": torch.randn(h, i)}
    save_file(tensors, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": h}))
    (src / "tokenizer.json").write_text("{}")
    return src


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_writes_an_fp8_checkpoint_and_leaves_the_source_alone(source, tmp_path):
    before = digest(source)
    dst = tmp_path / "dst"
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(dst),
                 "--ignore", "model.layers.1.mlp.down_proj"]) == 0
    assert digest(source) == before
    config = json.loads((dst / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"  # float-quantized, as llm-compressor
    assert config["quantization_config"]["ignore"] == ["lm_head", "model.layers.1.mlp.down_proj"]
    assert (dst / "tokenizer.json").is_file()
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight_scale").shape == (64, 1)
        assert f.get_tensor("model.layers.1.mlp.down_proj.weight").dtype == torch.float32  # ignored
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(dst)]) == 1  # exists


def test_an_interrupted_run_leaves_no_destination(source, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(quantize_cmd, "save_shards", interrupted)
    dst = tmp_path / "dst"
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(dst)]) == 130
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_leftover_from_a_killed_run_is_pointed_out(source, tmp_path, capsys):
    leftover = tmp_path / ".dst.partial-abc123"  # what a SIGKILLed run leaves (it cannot clean up)
    leftover.mkdir()
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(tmp_path / "dst")]) == 0
    assert f"{leftover} is left from an interrupted run" in capsys.readouterr().err


def test_damaged_source_is_a_message_not_a_traceback(source, tmp_path, capsys):
    data = (source / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err  # was a SafetensorError traceback
    assert "model.safetensors" in err and "truncated or corrupt" in err
    (source / "config.json").write_text("{oops")
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(tmp_path / "b")]) == 1
    assert "config.json is not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_device_that_cannot_run_the_search_is_a_clear_error(source, tmp_path, capsys):
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(tmp_path / "a"),
                 "--device", "cuda"]) == 1
    assert "CUDA is not available" in capsys.readouterr().err
    assert main(["quantize", "--method", "fp8_w8a16", "--model", str(source), "--out", str(tmp_path / "b"),
                 "--device", "mps"]) == 1
    assert "runs on cpu or cuda" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_each_layer_gets_its_own_calibration_inputs(source, tmp_path):
    """Calibration travels one layer group at a time (to the search's device); the strict per-linear check of
    the fp8 GPTQ path still sees every input it needs."""
    from nanocore.plugins import get_registry

    shapes = {"self_attn.q_proj": 64, "self_attn.k_proj": 64, "self_attn.v_proj": 64, "self_attn.o_proj": 64,
              "mlp.gate_proj": 64, "mlp.up_proj": 64, "mlp.down_proj": 128}
    calibration = {f"model.layers.{n}.{m}": torch.randn(16, k) for n in range(2) for m, k in shapes.items()}
    calibration["lm_head"] = torch.randn(16, 64)
    mine = quantize_cmd._calibration_of("model.layers.1", calibration, torch.device("cpu"))
    assert sorted(mine) == sorted(f"model.layers.1.{m}" for m in shapes)
    assert sorted(quantize_cmd._calibration_of("", calibration, torch.device("cpu"))) == ["lm_head"]
    assert quantize_cmd._calibration_of("model.layers.0", None, torch.device("cpu")) is None
    method = get_registry().get("linear_method", "fp8_w8a16").cls
    out = tmp_path / "out"
    out.mkdir()
    config = quantize_cmd.write_quantized(source, out, method, calibration, [], {}, torch.device("cpu"))
    assert config["quant_method"] == "compressed-tensors"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.1.mlp.down_proj.weight").dtype == torch.float8_e4m3fn


def test_calibration_named_differently_from_the_checkpoint_is_an_error(source, tmp_path):
    from nanocore.plugins import get_registry

    calibration = {"model.language_model.layers.0.mlp.up_proj": torch.randn(16, 64)}  # another naming scheme
    method = get_registry().get("linear_method", "fp8_w8a16").cls
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="none for the linears of 'model.layers.0'.*module names must match"):
        quantize_cmd.write_quantized(source, out, method, calibration, [], {}, torch.device("cpu"))
