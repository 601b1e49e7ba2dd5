"""cutlass on CPU (the twin): loading fp8 checkpoints through the parallel layers, options, selection."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from nanocore.distributed import ParallelContext
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.loader.model_loader import resolve_linear_method
from nanocore.plugins import get_registry
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore.toolkit.checkpoint_support import fp8_checkpoint_config
from nanocore_cutlass import CutlassFp8LinearMethod
from nanocore_cutlass.method import _pad_for_tma
from nanocore_cutlass.twin import fp8_linear_twin

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def registered():
    """Resolving through the registry sets the class's name, as the engine does."""
    assert get_registry().get("linear_method", "cutlass").cls is CutlassFp8LinearMethod


def quantized(weight, calibration=None):
    tensors, config = CutlassFp8LinearMethod.quantize({"layer.weight": weight}, calibration)
    return {k.split(".", 1)[1]: v for k, v in tensors.items()}, config


def load(layer, tensors, shard_id=None):
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))


@pytest.mark.parametrize("m", [1, 7, 64])
def test_loaded_layer_runs_the_twin(m):
    torch.manual_seed(m)
    w, x, bias = torch.randn(48, 64) / 8, torch.randn(m, 64), torch.randn(48)
    layer = RowParallelLinear(64, 48, bias=False, linear_method=CutlassFp8LinearMethod(), parallel=ParallelContext(),
                              params_dtype=torch.float32)
    tensors, config = quantized(w)
    assert config == fp8_checkpoint_config("dynamic")  # compressed-tensors float-quantized, as llm-compressor writes
    load(layer, tensors)
    layer.linear_method.process_weights_after_loading(layer)
    got = layer.linear_method.apply(layer, x, bias)
    torch.testing.assert_close(got, fp8_linear_twin(x, tensors["weight"], tensors["weight_scale"]) + bias)
    expected = F.linear(x, w, bias)
    assert ((got - expected).abs() <= 0.07 * (x.abs() @ w.abs().t()).max()).all()


def test_qkv_per_tensor_scales_spread_over_their_shards():
    qkv = QKVParallelLinear(32, 8, 4, 2, linear_method=CutlassFp8LinearMethod(), parallel=ParallelContext(),
                            params_dtype=torch.float32)
    scales = {"q": 0.5, "k": 2.0, "v": 0.25}
    for shard_id, rows in (("q", 32), ("k", 16), ("v", 16)):
        load(qkv, {"weight": torch.randn(rows, 32).to(torch.float8_e4m3fn), "weight_scale": torch.tensor(scales[shard_id])},
             shard_id)
    qkv.linear_method.process_weights_after_loading(qkv)
    assert qkv.weight_scale.view(-1).tolist() == [0.5] * 32 + [2.0] * 16 + [0.25] * 16


def test_static_input_scale_is_the_max_over_merged_shards_and_is_used():
    method = CutlassFp8LinearMethod({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}})
    layer = MergedColumnParallelLinear(16, [8, 8], linear_method=method, parallel=ParallelContext(),
                                       params_dtype=torch.float32)
    x = torch.randn(20, 16)
    for i in range(2):
        tensors, config = quantized(torch.randn(8, 16), {"layer": x * (i + 1)})
        load(layer, tensors, i)
    assert config == fp8_checkpoint_config("static")
    method.process_weights_after_loading(layer)
    assert layer.input_scale.item() == pytest.approx(float((2 * x).abs().max()) / 448)
    expected = fp8_linear_twin(x, layer.weight, layer.weight_scale, layer.input_scale)
    torch.testing.assert_close(method.apply(layer, x), expected)
    assert not torch.allclose(expected, fp8_linear_twin(x, layer.weight, layer.weight_scale))


def test_wrong_checkpoints_are_clear_errors():
    layer = RowParallelLinear(16, 8, linear_method=CutlassFp8LinearMethod(), parallel=ParallelContext(),
                              params_dtype=torch.bfloat16)
    with pytest.raises(CheckpointFormatError, match="expected torch.float8_e4m3fn"):
        layer.weight.weight_loader(layer.weight, torch.randn(8, 16, dtype=torch.bfloat16))
    layer.weight.weight_loader(layer.weight, torch.randn(8, 16).to(torch.float8_e4m3fn))
    with pytest.raises(CheckpointFormatError, match="no \\['weight_scale'\\]"):
        layer.linear_method.process_weights_after_loading(layer)
    with pytest.raises(CheckpointFormatError, match="block-wise"):
        CutlassFp8LinearMethod({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})


def test_bad_options():
    with pytest.raises(ValueError, match="kernel must be"):
        CutlassFp8LinearMethod({"kernel": "triton"})
    with pytest.raises(ValueError, match="activation_scheme"):
        CutlassFp8LinearMethod({"activation_scheme": "per_tensor"})
    with pytest.raises(ValueError, match="unknown option"):
        CutlassFp8LinearMethod({"tile": 128})
    with pytest.raises(ValueError, match="fp8_w8a8"):
        CutlassFp8LinearMethod.quantize({"layer.weight": torch.randn(8, 16)}, None, fp8_scale="search")


def test_padding_for_tma_keeps_the_result():
    w, x = torch.randn(30, 40), torch.randn(5, 40)
    method = CutlassFp8LinearMethod({"kernel": "torch"})
    layer = RowParallelLinear(40, 30, bias=False, linear_method=method, parallel=ParallelContext(),
                              params_dtype=torch.float32)
    load(layer, quantized(w)[0])
    method.process_weights_after_loading(layer)
    before = method.apply(layer, x)
    _pad_for_tma(layer)
    assert layer.weight.shape == (32, 48) and layer.weight_scale.shape == (32, 1)
    assert layer.weight[30:].float().abs().sum() == 0 and layer.weight[:, 40:].float().abs().sum() == 0
    torch.testing.assert_close(method.apply(layer, x), before)


def _fp8_hf_config():
    return SimpleNamespace(quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"})


def test_auto_keeps_the_existing_fp8_method_and_cutlass_is_chosen_by_name():
    fp8 = [e for es in get_registry().entries["linear_method"].values() for e in es if e.cls.quant_method == "fp8"]
    others = [e.cls.checkpoint_priority for e in fp8 if e.cls is not CutlassFp8LinearMethod]
    assert others and CutlassFp8LinearMethod.checkpoint_priority < min(others)
    entry, options = resolve_linear_method("auto", {}, _fp8_hf_config(), CPU)
    assert entry.name != "cutlass"
    entry, options = resolve_linear_method("cutlass", {}, _fp8_hf_config(), CPU)
    assert entry.cls is CutlassFp8LinearMethod and options["quantization_config"]["quant_method"] == "fp8"
    with pytest.raises(ValueError, match="loads 'fp8' checkpoints"):
        resolve_linear_method("cutlass", {}, SimpleNamespace(quantization_config={"quant_method": "awq"}), CPU)
