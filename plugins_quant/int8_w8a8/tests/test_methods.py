"""int8 methods: numerics, compressed-tensors configs, loading through the parallel layers, bad checkpoints."""
import pytest
import torch
import torch.nn.functional as F

from nanocore.distributed import ParallelContext
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore_int8 import Int8W8A8LinearMethod, Int8W8A16LinearMethod
from nanocore_int8.config import activation_scheme_of, compressed_tensors_config


def load(layer, tensors, shard_id=None):
    for name, tensor in tensors.items():
        param = getattr(layer, name.rsplit(".", 1)[-1] if name.startswith("layer.") else name)
        param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))


def build(method, weight, calibration=None, cls=RowParallelLinear):
    tensors, config = type(method).quantize({"layer.weight": weight}, calibration)
    layer = cls(weight.shape[1], weight.shape[0], linear_method=method, parallel=ParallelContext(),
                params_dtype=torch.float32)
    load(layer, tensors)
    method.process_weights_after_loading(layer)
    return layer, config


@pytest.mark.parametrize("m", [1, 4, 17, 100])
def test_w8a8_dynamic_is_int_gemm_of_quantized_inputs(m):
    torch.manual_seed(m)
    w, x, bias = torch.randn(40, 64), torch.randn(m, 64), torch.randn(40)
    layer, config = build(Int8W8A8LinearMethod(), w)
    assert activation_scheme_of(config, "?") == "dynamic"
    got = layer.linear_method.apply(layer, x, bias)
    x_scale = x.abs().amax(1, keepdim=True) / 127
    xq = (x / x_scale).round()
    expected = F.linear(xq * x_scale, layer.weight.float() * layer.weight_scale, bias)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    reference = F.linear(x, w, bias)
    assert float((got - reference).abs().max() / reference.abs().max()) < Int8W8A8LinearMethod.tolerance[0]


def test_w8a8_static_scale_from_calibration_and_merged_max():
    x = torch.randn(30, 32)
    method = Int8W8A8LinearMethod({"quantization_config": compressed_tensors_config("static")})
    layer = MergedColumnParallelLinear(32, [8, 8], linear_method=method, parallel=ParallelContext(),
                                       params_dtype=torch.float32)
    for i in range(2):
        tensors, config = Int8W8A8LinearMethod.quantize({"layer.weight": torch.randn(8, 32)}, {"layer": x * (i + 1)})
        load(layer, tensors, i)
    assert activation_scheme_of(config, "?") == "static"
    method.process_weights_after_loading(layer)
    assert layer.input_scale.item() == pytest.approx(float(2 * x.abs().max()) / 127)
    reference = F.linear(x, layer.weight.float() * layer.weight_scale)
    got = method.apply(layer, x)
    assert float((got - reference).abs().max() / reference.abs().max()) < 0.03


@pytest.mark.parametrize("m", [1, 3, 50])
def test_w8a16_is_dequantize_then_linear(m):
    w, x = torch.randn(24, 48), torch.randn(m, 48)
    layer, config = build(Int8W8A16LinearMethod(), w)
    assert config["config_groups"]["group_0"]["input_activations"] is None
    expected = F.linear(x, layer.weight.float() * layer.weight_scale)
    torch.testing.assert_close(layer.linear_method.apply(layer, x), expected)


def test_weight_only_config_makes_w8a8_run_weight_only():
    method = Int8W8A8LinearMethod({"quantization_config": compressed_tensors_config("none")})
    assert method.activation_scheme == "none"


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_qkv_tp_shards(tp_rank):
    qkv = QKVParallelLinear(32, 8, 4, 2, linear_method=Int8W8A8LinearMethod(),
                            parallel=ParallelContext(tp_rank=tp_rank, tp_size=2), params_dtype=torch.float32)
    full = {s: torch.randn(rows, 32) for s, rows in (("q", 32), ("k", 16), ("v", 16))}
    for shard_id, w in full.items():
        tensors, _ = Int8W8A8LinearMethod.quantize({"weight": w})
        load(qkv, tensors, shard_id)
    expected = torch.cat([full[s].chunk(2)[tp_rank] for s in "qkv"])
    assert ((qkv.weight.float() * qkv.weight_scale - expected).abs() <= expected.abs().amax(1, keepdim=True) / 200).all()


def test_mismatching_checkpoints_are_clear_errors():
    layer = RowParallelLinear(16, 8, linear_method=Int8W8A8LinearMethod(), parallel=ParallelContext(),
                              params_dtype=torch.float32)
    with pytest.raises(CheckpointFormatError, match="expected torch.int8"):
        layer.weight.weight_loader(layer.weight, torch.randn(8, 16).to(torch.float8_e4m3fn))
    fp8_config = compressed_tensors_config("dynamic")
    fp8_config["config_groups"]["group_0"]["weights"]["type"] = "float"
    with pytest.raises(CheckpointFormatError, match="fp8_w8a8"):
        Int8W8A8LinearMethod({"quantization_config": fp8_config})
    with pytest.raises(ValueError, match="calibration"):
        Int8W8A8LinearMethod._quantize({"weight": torch.randn(4, 4)}, None, "static")


@pytest.mark.parametrize("scheme,expected", [("none", Int8W8A16LinearMethod), ("dynamic", Int8W8A8LinearMethod),
                                             ("static", Int8W8A8LinearMethod)])
def test_auto_preference_follows_the_checkpoint_activation_scheme(scheme, expected):
    config = compressed_tensors_config(scheme)
    ranked = max((Int8W8A16LinearMethod, Int8W8A8LinearMethod), key=lambda c: c.checkpoint_priority_for(config))
    assert ranked is expected
    broken = {"quant_method": "compressed-tensors"}  # no config_groups: the default (int8_w8a8), no exception
    assert Int8W8A8LinearMethod.checkpoint_priority_for(broken) > Int8W8A16LinearMethod.checkpoint_priority_for(broken)


def test_int8_w8a16_checkpoint_loads_by_name_and_auto(tmp_path):
    """The checkpoint `nanocore quantize --method int8_w8a16` writes loads by name, and `auto` picks int8_w8a16."""
    import sys
    from pathlib import Path

    from nanocore.cli.main import main
    from nanocore.config import EngineConfig
    from nanocore.loader import load_model, model_loader

    sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
    from model_fixtures import make_checkpoint, nanocore_logits

    make_checkpoint(tmp_path / "src", "llama")
    assert main(["quantize", "--method", "int8_w8a16", "--model", str(tmp_path / "src"), "--out",
                 str(tmp_path / "q")]) == 0
    seqs = [[5, 17, 200, 3, 99, 42, 7]]
    by_name = load_model(EngineConfig(model=str(tmp_path / "q"), device="cpu", linear_method="int8_w8a16"), "cpu")
    reference = load_model(EngineConfig(model=str(tmp_path / "src"), device="cpu"), "cpu")
    methods = {type(m.linear_method) for m in by_name.model.modules() if hasattr(m, "linear_method")}
    assert Int8W8A16LinearMethod in methods and Int8W8A8LinearMethod not in methods
    got, expected = nanocore_logits(by_name.model, seqs), nanocore_logits(reference.model, seqs)
    assert not torch.equal(got, expected)  # really quantized
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05 * float(expected.abs().max()))
    hf_config = type("Cfg", (), {"quantization_config": compressed_tensors_config("none")})()
    entry, _ = model_loader.resolve_linear_method("auto", {}, hf_config, torch.device("cpu"))
    assert entry.name == "int8_w8a16"


def packed_channel_config():
    """llm-compressor's channel-wise W8A16 (pack-quantized, symmetric, one scale per output channel)."""
    from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
    from nanocore.toolkit.checkpoint_support import compressed_tensors_config as ct_config

    return ct_config(QuantScheme(QuantArgs(8, "int", "channel")), "pack-quantized")


@pytest.mark.parametrize("cls", [Int8W8A16LinearMethod, Int8W8A8LinearMethod])
def test_pack_quantized_w8a16_unpacks_to_the_int8_weight(cls):
    """Four offset-binary bytes per int32 word (compressed-tensors' packing) -> the signed int8 weight, merged
    gate/up shards included; the layer then holds what an int-quantized checkpoint gives."""
    from nanocore.toolkit.int_packing import dequantize_int, pack_quantized_tensors, quantize_int_groups

    config = packed_channel_config()
    assert cls.checkpoint_support(config) is None
    method = cls({"quantization_config": config})
    assert method.activation_scheme == "none"
    layer = MergedColumnParallelLinear(64, [24, 16], linear_method=method, parallel=ParallelContext(),
                                       params_dtype=torch.float32)
    full = [torch.randn(24, 64), torch.randn(16, 64)]
    full[0][0, :8] = torch.tensor([-4.0, 4.0, 0.0, 1.0, -1.0, 2.0, -2.0, 3.0])  # +-127 and 0 in one row
    for i, w in enumerate(full):
        load(layer, pack_quantized_tensors(w, 8, 64, symmetric=True), i)
    method.process_weights_after_loading(layer)
    assert not hasattr(layer, "weight_packed") and layer.weight.dtype == torch.int8
    q, scales, zeros = zip(*(quantize_int_groups(w, 8, 64, True) for w in full))
    assert torch.equal(layer.weight, (torch.cat(q) - 128).to(torch.int8))  # the signed values, bit for bit
    assert layer.weight[0, :2].tolist() == [-127, 127]
    held = dequantize_int(torch.cat(q), torch.cat(scales).float(), torch.cat(zeros))
    x = torch.randn(3, 64)
    torch.testing.assert_close(method.apply(layer, x), F.linear(x, held), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_pack_quantized_row_parallel_takes_whole_words(tp_rank):
    from nanocore.toolkit.int_packing import pack_quantized_tensors

    method = Int8W8A16LinearMethod({"quantization_config": packed_channel_config()})
    layer = RowParallelLinear(64, 8, linear_method=method, parallel=ParallelContext(tp_rank=tp_rank, tp_size=2),
                              params_dtype=torch.float32)
    w = torch.randn(8, 64)
    load(layer, pack_quantized_tensors(w, 8, 64, symmetric=True))
    method.process_weights_after_loading(layer)
    scale = w.abs().amax(1, keepdim=True) / 127.5  # compressed-tensors' symmetric rule: absmax / (255 / 2)
    expected = (w / scale).round().clamp(-128, 127).chunk(2, dim=1)[tp_rank]
    assert torch.equal(layer.weight.float(), expected)


@pytest.mark.parametrize("weights, can", [
    ({"strategy": "group", "group_size": 64}, "wna16"),  # group-wise 8-bit (llm-compressor 0.14's W8A16 preset)
    ({"symmetric": False}, "wna16"),
    ({"num_bits": 4, "strategy": "group", "group_size": 64}, "wna16"),
])
def test_packed_formats_the_int8_methods_leave_to_wna16(weights, can):
    config = packed_channel_config()
    config["config_groups"]["group_0"]["weights"].update(weights)
    for cls in (Int8W8A16LinearMethod, Int8W8A8LinearMethod):
        reason = cls.checkpoint_support(config)
        assert reason and can in reason


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_w8a8_activation_quantization_follows_the_kernel_option(monkeypatch, kernel):
    # kernel='torch' keeps every step on the torch twin (no Triton launch); 'auto' takes toolkit.act_quant's kernel
    import nanocore_int8.methods as methods
    calls = []
    monkeypatch.setattr(methods, "quantize_per_token", lambda x2, dtype: calls.append(dtype) or
                        methods.quantize_int8_per_row(x2))
    layer, _ = build(Int8W8A8LinearMethod({"kernel": kernel}), torch.randn(24, 32))
    layer.linear_method.apply(layer, torch.randn(20, 32))
    assert calls == ([] if kernel == "torch" else [torch.int8])
