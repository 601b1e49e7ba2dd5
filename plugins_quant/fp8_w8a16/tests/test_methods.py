"""fp8 methods: apply numerics, loading through the parallel layers (merged, TP shards), bad checkpoints."""
import pytest
import torch
import torch.nn.functional as F

from nanocore.distributed import ParallelContext
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore.toolkit.checkpoint_support import fp8_checkpoint_config
from nanocore.toolkit.numerics import quantize_fp8, quantize_fp8_per_row, quantize_fp8_weight
from nanocore_fp8 import Fp8W8A8LinearMethod, Fp8W8A16LinearMethod

METHODS = [Fp8W8A16LinearMethod, Fp8W8A8LinearMethod]


def quantized(cls, weight, calibration=None):
    tensors, config = cls.quantize({"layer.weight": weight}, calibration)
    return {k.split(".", 1)[1]: v for k, v in tensors.items()}, config


def load(layer, tensors, shard_id=None):
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))


@pytest.mark.parametrize("cls", METHODS)
@pytest.mark.parametrize("m", [1, 2, 7, 33, 128])
def test_apply_vs_dequantized_linear_and_oracle(cls, m):
    torch.manual_seed(m)
    w, x, bias = torch.randn(48, 64) / 8, torch.randn(m, 64), torch.randn(48)
    layer = RowParallelLinear(64, 48, bias=False, linear_method=cls(), parallel=ParallelContext(),
                              params_dtype=torch.float32)
    load(layer, quantized(cls, w)[0])
    layer.linear_method.process_weights_after_loading(layer)
    got = layer.linear_method.apply(layer, x, bias)
    dequantized = layer.weight.float() * layer.weight_scale
    if cls is Fp8W8A16LinearMethod:
        torch.testing.assert_close(got, F.linear(x, dequantized, bias), rtol=1e-5, atol=1e-5)
    expected = F.linear(x, w, bias)
    atol, rtol = cls.tolerance
    assert ((got - expected).abs() <= atol * expected.abs().max() + rtol * expected.abs()).all()


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_qkv_and_gate_up_load_tp_shards(tp_rank):
    parallel = ParallelContext(tp_rank=tp_rank, tp_size=2)
    qkv = QKVParallelLinear(32, 8, 4, 2, linear_method=Fp8W8A16LinearMethod(), parallel=parallel,
                            params_dtype=torch.float32)
    full = {s: torch.randn(rows, 32) for s, rows in (("q", 32), ("k", 16), ("v", 16))}
    for shard_id, w in full.items():
        load(qkv, quantized(Fp8W8A16LinearMethod, w)[0], shard_id)
    expected = torch.cat([full["q"].chunk(2)[tp_rank], full["k"].chunk(2)[tp_rank], full["v"].chunk(2)[tp_rank]])
    dequantized = qkv.weight.float() * qkv.weight_scale
    assert ((dequantized - expected).abs() <= 0.07 * expected.abs() + 1e-6).all()

    gate_up = MergedColumnParallelLinear(32, [24, 24], linear_method=Fp8W8A16LinearMethod(), parallel=parallel,
                                         params_dtype=torch.float32)
    halves = [torch.randn(24, 32), torch.randn(24, 32)]
    for i, w in enumerate(halves):
        load(gate_up, quantized(Fp8W8A16LinearMethod, w)[0], i)
    expected = torch.cat([h.chunk(2)[tp_rank] for h in halves])
    assert ((gate_up.weight.float() * gate_up.weight_scale - expected).abs() <= 0.07 * expected.abs() + 1e-6).all()


def test_row_parallel_shards_the_input_dim():
    w = torch.randn(16, 64)
    tensors = quantized(Fp8W8A16LinearMethod, w)[0]
    x = torch.randn(3, 64)
    partial = []
    for rank in (0, 1):
        layer = RowParallelLinear(64, 16, linear_method=Fp8W8A16LinearMethod(),
                                  parallel=ParallelContext(tp_rank=rank, tp_size=2), params_dtype=torch.float32)
        load(layer, tensors)
        partial.append(layer.linear_method.apply(layer, x.chunk(2, dim=1)[rank]))
    expected = x @ (tensors["weight"].float() * tensors["weight_scale"]).t()
    torch.testing.assert_close(partial[0] + partial[1], expected, rtol=1e-4, atol=1e-4)


def test_per_tensor_scales_of_merged_shards():
    layer = MergedColumnParallelLinear(16, [8, 8], linear_method=Fp8W8A16LinearMethod(), parallel=ParallelContext(),
                                       params_dtype=torch.float32)
    for i, s in enumerate((0.5, 2.0)):
        load(layer, {"weight": torch.randn(8, 16).to(torch.float8_e4m3fn), "weight_scale": torch.tensor(s)}, i)
    layer.linear_method.process_weights_after_loading(layer)
    assert layer.weight_scale.view(-1).tolist() == [0.5] * 8 + [2.0] * 8


def test_merged_tensor_scale_and_mixed_or_missing_shard_scales():
    make = lambda: MergedColumnParallelLinear(16, [8, 8], linear_method=Fp8W8A16LinearMethod(),  # noqa: E731
                                              parallel=ParallelContext(), params_dtype=torch.float32)
    fused = make()  # the checkpoint holds gate_up itself with one scale: every row gets it
    load(fused, {"weight": torch.randn(16, 16).to(torch.float8_e4m3fn), "weight_scale": torch.tensor(0.25)})
    fused.linear_method.process_weights_after_loading(fused)
    assert fused.weight_scale.view(-1).tolist() == [0.25] * 16
    mixed = make()  # one shard per tensor, the other per channel: each keeps its own
    load(mixed, {"weight": torch.randn(8, 16).to(torch.float8_e4m3fn), "weight_scale": torch.tensor(0.5)}, 0)
    load(mixed, {"weight": torch.randn(8, 16).to(torch.float8_e4m3fn), "weight_scale": torch.full((8, 1), 3.0)}, 1)
    mixed.linear_method.process_weights_after_loading(mixed)
    assert mixed.weight_scale.view(-1).tolist() == [0.5] * 8 + [3.0] * 8
    partial = make()  # a shard without scales is an error, not a silent 1.0
    load(partial, {"weight": torch.randn(8, 16).to(torch.float8_e4m3fn), "weight_scale": torch.tensor(0.5)}, 0)
    load(partial, {"weight": torch.randn(8, 16).to(torch.float8_e4m3fn)}, 1)
    with pytest.raises(CheckpointFormatError, match=r"not for \[1\]"):
        partial.linear_method.process_weights_after_loading(partial)


def test_static_input_scale_takes_the_max_over_shards():
    method = Fp8W8A8LinearMethod({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}})
    layer = MergedColumnParallelLinear(16, [8, 8], linear_method=method, parallel=ParallelContext(),
                                       params_dtype=torch.float32)
    x = torch.randn(20, 16)
    for i in range(2):
        tensors, config = quantized(Fp8W8A8LinearMethod, torch.randn(8, 16), {"layer": x * (i + 1)})
        load(layer, tensors, i)
    assert config == fp8_checkpoint_config("static")
    method.process_weights_after_loading(layer)
    assert layer.input_scale.item() == pytest.approx(float((2 * x).abs().max()) / 448)
    assert method.apply(layer, x).shape == (20, 16)


def test_wrong_dtype_and_missing_tensor_are_clear_errors():
    layer = RowParallelLinear(16, 8, linear_method=Fp8W8A16LinearMethod(), parallel=ParallelContext(),
                              params_dtype=torch.bfloat16)
    with pytest.raises(CheckpointFormatError, match="dtype torch.bfloat16, expected torch.float8_e4m3fn"):
        layer.weight.weight_loader(layer.weight, torch.randn(8, 16, dtype=torch.bfloat16))
    layer.weight.weight_loader(layer.weight, torch.randn(8, 16).to(torch.float8_e4m3fn))
    with pytest.raises(CheckpointFormatError, match="no \\['weight_scale'\\]"):
        layer.linear_method.process_weights_after_loading(layer)
    with pytest.raises(CheckpointFormatError, match="does not fit"):
        layer.weight_scale.weight_loader(layer.weight_scale, torch.ones(9, 1))
    with pytest.raises(CheckpointFormatError, match="fp8_w8a16 loads them"):  # block-wise: test_block_scales.py
        Fp8W8A8LinearMethod({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})


def test_quantize_keeps_embeddings_norms_and_lm_head():
    weights = {"model.embed_tokens.weight": torch.randn(10, 8), "model.norm.weight": torch.ones(8),
               "lm_head.weight": torch.randn(10, 8), "model.layers.0.mlp.down_proj.weight": torch.randn(8, 16)}
    tensors, config = Fp8W8A16LinearMethod.quantize(weights)
    assert config == fp8_checkpoint_config("none")  # weight-only compressed-tensors float-quantized
    assert tensors["model.layers.0.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    assert tensors["model.layers.0.mlp.down_proj.weight_scale"].shape == (8, 1)
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert tensors[name] is weights[name]
    with pytest.raises(ValueError, match="calibration"):
        Fp8W8A8LinearMethod._quantize(weights, None, "static")


def _correlated_inputs(rows, k, seed=0):
    """Activations with uneven channel scales and correlated channels, like a transformer's."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k)
    return (torch.randn(rows, k, generator=g) @ mix) * torch.rand(k, generator=g).add(0.1) * 4


def test_scale_search_beats_absmax_and_absmax_is_the_plain_cast():
    torch.manual_seed(0)
    w = torch.randn(64, 96) * torch.rand(64, 1)
    q_abs, s_abs = quantize_fp8_weight(w, scale_method="absmax")
    q_ref, s_ref = quantize_fp8_per_row(w)
    assert torch.equal(q_abs.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s_abs, s_ref)
    q, s = quantize_fp8_weight(w)  # default: search
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (64, 1)
    row_err = lambda q, s: ((q.float() * s - w) ** 2).sum(1)  # noqa: E731
    assert (row_err(q, s) <= row_err(q_abs, s_abs) + 1e-12).all()
    assert row_err(q, s).sum() < 0.9 * row_err(q_abs, s_abs).sum()
    # fp8 values are a plain cast of w / scale: round to nearest, in range
    assert torch.equal(q.view(torch.uint8), (w / s).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))


def test_calibrated_quantization_lowers_the_output_error():
    torch.manual_seed(1)
    w, x = torch.randn(48, 128) / 8, _correlated_inputs(512, 128)
    q_rtn, s_rtn = quantize_fp8_weight(w, scale_method="absmax")
    q, s = quantize_fp8_weight(w, x)
    out_err = lambda q, s: float((x @ (q.float() * s - w).t()).norm() / (x @ w.t()).norm())  # noqa: E731
    assert out_err(q, s) < 0.8 * out_err(q_rtn, s_rtn)
    # the same scale, round to nearest: GPTQ moved values only to lower the output error
    assert out_err(q, s) < out_err(quantize_fp8(w, s), s)


@pytest.mark.parametrize("cls", METHODS)
def test_quantize_with_calibration_keeps_the_standard_format(cls):
    w, x = torch.randn(16, 32), _correlated_inputs(64, 32)
    tensors, config = cls.quantize({"layer.weight": w}, {"layer": x})
    assert config == fp8_checkpoint_config("none" if cls is Fp8W8A16LinearMethod else "static")
    assert tensors["layer.weight"].dtype == torch.float8_e4m3fn and tensors["layer.weight"].shape == (16, 32)
    assert tensors["layer.weight_scale"].dtype == torch.float32 and tensors["layer.weight_scale"].shape == (16, 1)
    with pytest.raises(ValueError, match="fp8_scale must be one of"):
        cls.quantize({"layer.weight": w}, None, fp8_scale="mse")


def test_cli_fp8_scale_option(tmp_path, capsys):
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from nanocore.cli.main import main

    sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
    from model_fixtures import make_checkpoint

    make_checkpoint(tmp_path / "src", "llama")
    src = load_file(str(tmp_path / "src" / "model.safetensors"))
    name = next(n for n in src if n.endswith("down_proj.weight"))
    for scale in ("absmax", "search"):
        assert main(["quantize", "--method", "fp8_w8a16", "--model", str(tmp_path / "src"), "--out",
                     str(tmp_path / scale), "--fp8-scale", scale]) == 0
    absmax, search = (load_file(str(tmp_path / s / "model.safetensors")) for s in ("absmax", "search"))
    torch.testing.assert_close(absmax[name[:-6] + "weight_scale"], quantize_fp8_per_row(src[name])[1])
    err = {k: float((t[name].float() * t[name[:-6] + "weight_scale"] - src[name]).norm())
           for k, t in (("absmax", absmax), ("search", search))}
    assert err["search"] < err["absmax"]
    assert main(["quantize", "--method", "int8_w8a8", "--model", str(tmp_path / "src"), "--out", str(tmp_path / "x"),
                 "--fp8-scale", "absmax"]) != 0
    assert "takes no fp8_scale, so --fp8-scale does not apply" in capsys.readouterr().err


def test_calibration_for_other_modules_is_an_error_not_a_silent_fallback():
    with pytest.raises(ValueError, match="none for 'layer'"):
        quantized(Fp8W8A16LinearMethod, torch.randn(8, 16), {"model.other": torch.randn(4, 16)})


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_w8a8_activation_quantization_follows_the_kernel_option(monkeypatch, kernel):
    # kernel='torch' keeps every step on torch ops (no Triton launch); 'auto' takes toolkit.act_quant's kernel
    import nanocore_fp8.methods as methods
    calls = []
    monkeypatch.setattr(methods, "quantize_per_token", lambda x2, dtype: calls.append(dtype) or
                        quantize_fp8_per_row(x2))
    method = Fp8W8A8LinearMethod({"kernel": kernel})
    layer = RowParallelLinear(32, 24, bias=False, linear_method=method, parallel=ParallelContext(),
                              params_dtype=torch.float32)
    load(layer, quantized(Fp8W8A8LinearMethod, torch.randn(24, 32))[0])
    method.process_weights_after_loading(layer)
    method.apply(layer, torch.randn(5, 32))
    assert calls == ([] if kernel == "torch" else [torch.float8_e4m3fn])
