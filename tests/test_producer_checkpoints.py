"""Checkpoints written by llm-compressor and AutoAWQ themselves (tests/data/producers, made by
benchmarks/make_producer_checkpoints.py and make_autoawq_checkpoint.py) load with ``auto``, pick the method that
matches what they are, and give the logits of the producer's own toolchain (``reference_logits.pt``: transformers +
compressed-tensors re-reading the folder in float32; for AutoAWQ, its own ``dequantize_gemm``)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from nanocore.config import EngineConfig
from nanocore.layers.attention import AttentionMetadata
from nanocore.loader import load_model

PRODUCERS = Path(__file__).parent / "data" / "producers"
#: folder -> (method auto picks, method that computes exactly what the checkpoint declares, allowed error)
EXPECTED = {
    # AutoAWQ 0.2.9 (benchmarks/make_autoawq_checkpoint.py): reference = its own dequantize_gemm of the packed tensors
    "llama_autoawq_gemm": ("awq", "awq", 1e-4),
    # FP8_BLOCK (128 x 128 tiles, 160 / 288 / 80-row dims: full and partial tiles): reference = a float32 model
    # holding compressed-tensors' own dequantize of the tiles (its forward cannot run: 160 inputs are no group of 128)
    "llama_fp8_block": ("fp8_w8a16", "fp8_w8a16", 1e-4),
    "llama_fp8_dynamic": ("fp8_w8a16", "fp8_w8a8", 1e-4),
    "llama_fp8_static": ("fp8_w8a16", "fp8_w8a8", 1e-4),
    "llama_w8a8_int8": ("int8_w8a8", "int8_w8a8", 0.08),  # int8 activations: nanocore rounds to +-127, ct to 127.5
    "llama_w4a16": ("wna16", "wna16", 1e-4),
    "llama_w4a16_asym": ("wna16", "wna16", 1e-3),
    "llama_w8a16": ("wna16", "wna16", 1e-4),  # llm-compressor 0.14's W8A16 preset is group-wise (128)
    # channel-wise W8A16 (pack-quantized): unpacked to int8 at load, run on the int8 weight-only kernels
    "llama_w8a16_channel": ("int8_w8a16", "int8_w8a16", 1e-4),
    "qwen2_w4a16_gptq": ("wna16", "wna16", 1e-3),
    # experts run dequantized in float here; the producer also rounds their activations to fp8
    "qwen2_moe_fp8_dynamic": ("fp8_w8a16", "fp8_w8a8", 0.1),
    "qwen2_moe_w4a16": ("wna16", "wna16", 1e-2),
}


def producer_logits(folder: Path, method: str):
    reference = torch.load(folder / "reference_logits.pt")
    loaded = load_model(EngineConfig(model=str(folder), linear_method=method, dtype="float32"), "cpu")
    ids = reference["input_ids"]
    with torch.no_grad():
        hidden = loaded.model(ids, torch.arange(len(ids)), AttentionMetadata.for_prefill([len(ids)]))
        return loaded, loaded.model.compute_logits(hidden), reference["logits"]


def test_every_committed_checkpoint_is_covered():
    sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
    # GPTQModel's own checkpoints, tested there
    from test_gptq_producer import GPTQ_PRODUCED

    assert sorted(p.name for p in PRODUCERS.iterdir() if p.is_dir()) == sorted([*EXPECTED, *GPTQ_PRODUCED])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_auto_chooses_by_what_the_checkpoint_is(name, caplog):
    with caplog.at_level(logging.INFO, logger="nanocore"):
        loaded, ours, reference = producer_logits(PRODUCERS / name, "auto")
    assert loaded.linear_method == EXPECTED[name][0]
    assert any("auto linear_method" in r.message and EXPECTED[name][0] in r.message for r in caplog.records)
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.75


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_logits_match_the_producer(name):
    _, method, tolerance = EXPECTED[name]
    _, ours, reference = producer_logits(PRODUCERS / name, method)
    err = ((ours - reference).abs().max() / reference.abs().max()).item()
    assert err <= tolerance, f"{name} through {method}: largest logit error {err:.3g} of the largest logit"


def test_channel_w8a16_still_loads_in_wna16_and_holds_the_producer_int8_values():
    """By name, ``wna16`` loads the channel-wise W8A16 too (dequantizing in torch); the int8 method's unpacked
    weight is compressed-tensors' own reading of ``weight_packed`` (offset-binary bytes back to signed int8)."""
    from safetensors.torch import load_file

    _, ours, reference = producer_logits(PRODUCERS / "llama_w8a16_channel", "wna16")
    assert ((ours - reference).abs().max() / reference.abs().max()).item() <= 1e-4
    loaded, _, _ = producer_logits(PRODUCERS / "llama_w8a16_channel", "int8_w8a16")
    tensors = load_file(PRODUCERS / "llama_w8a16_channel" / "model.safetensors")
    packed = tensors["model.layers.0.mlp.down_proj.weight_packed"]
    n, k = tensors["model.layers.0.mlp.down_proj.weight_shape"].tolist()
    signed = torch.stack([(packed >> (8 * i)) & 0xFF for i in range(4)], dim=-1).reshape(n, k) - 128
    layer = loaded.model.get_submodule("model.layers.0.mlp.down_proj")
    assert layer.weight.dtype == torch.int8 and torch.equal(layer.weight.long(), signed.long())
    torch.testing.assert_close(layer.weight_scale.float(),
                               tensors["model.layers.0.mlp.down_proj.weight_scale"].float().reshape(n, 1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("rows", [1, 16, 40])  # the M = 1 GEMV, M <= 16, the tiled GEMM
def test_channel_w8a16_on_the_gpu_int8_kernels(rows):
    """On CUDA (bf16) the unpacked int8 weights run ``int8_w8a16``'s Triton kernels: logits of wna16's torch
    dequantization of the same checkpoint, and of the producer on its 16 tokens."""
    folder = PRODUCERS / "llama_w8a16_channel"
    reference = torch.load(folder / "reference_logits.pt")
    ids = reference["input_ids"].repeat(3)[:rows].cuda()
    logits = {}
    for method in ("auto", "wna16"):
        loaded = load_model(EngineConfig(model=str(folder), linear_method=method, dtype="bfloat16"), "cuda")
        assert loaded.linear_method == ("int8_w8a16" if method == "auto" else "wna16")
        with torch.no_grad():
            hidden = loaded.model(ids, torch.arange(rows, device="cuda"),
                                  AttentionMetadata.for_prefill([rows], device="cuda"))
            logits[method] = loaded.model.compute_logits(hidden).float().cpu()
    scale = logits["wna16"].abs().max()
    assert ((logits["auto"] - logits["wna16"]).abs().max() / scale).item() <= 2e-2
    n = min(rows, 16)
    producer = reference["logits"][:n]
    assert ((logits["auto"][:n] - producer).abs().max() / producer.abs().max()).item() <= 3e-2


def test_cutlass_twin_loads_llm_compressor_fp8():
    _, ours, reference = producer_logits(PRODUCERS / "llama_fp8_dynamic", "cutlass")
    assert ((ours - reference).abs().max() / reference.abs().max()).item() <= 1e-4


@pytest.mark.parametrize("name, wrong, right", [
    ("llama_fp8_dynamic", "int8_w8a16", "fp8_w8a16"),
    ("llama_fp8_block", "fp8_w8a8", "fp8_w8a16"),
    ("llama_fp8_block", "cutlass", "fp8_w8a16"),
    ("llama_w8a16", "int8_w8a16", "wna16"),
    ("llama_w8a16_channel", "awq", "int8_w8a16"),
    ("llama_w8a16_channel", "fp8_w8a16", "int8_w8a16"),
    ("llama_w4a16", "awq", "wna16"),
    ("llama_w8a8_int8", "fp8_w8a16", "int8_w8a8"),
])
def test_a_named_method_that_cannot_load_it_says_which_can(name, wrong, right):
    with pytest.raises(ValueError) as info:
        load_model(EngineConfig(model=str(PRODUCERS / name), linear_method=wrong), "cpu")
    message = str(info.value)
    assert wrong in message and right in message and "auto" in message


@pytest.mark.parametrize("source, block, cause", [
    ("llama_fp8_block", [128, 100], "re-quantize with block_structure \\[128, 128\\]"),  # no K tile divides 100
    ("llama_fp8_dynamic", [128, 128], "group size or block_structure"),  # per-channel scales declared as tiles
])
def test_unsupported_or_mislabelled_blocks_are_clear_errors(tmp_path, source, block, cause):
    import json
    import shutil

    folder = tmp_path / "block"
    shutil.copytree(PRODUCERS / source, folder)
    config = json.loads((folder / "config.json").read_text())
    weights = config["quantization_config"]["config_groups"]["group_0"]["weights"]
    weights.update(strategy="block", block_structure=block)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=cause):
        load_model(EngineConfig(model=str(folder)), "cpu")


NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}}
MIXED = {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {
    "attn": {"targets": ["re:.*self_attn.*"], "format": "pack-quantized",
             "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}},
    "mlp": {"targets": ["re:.*mlp.*"], "format": "float-quantized",
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}


@pytest.mark.parametrize("config, cause", [(NVFP4, "tensor_group"), (MIXED, "mixes 2 quantization schemes")])
def test_formats_nothing_loads_say_why(config, cause):
    from types import SimpleNamespace

    from nanocore.loader.linear_routing import resolve_linear_method

    with pytest.raises(ValueError, match=cause):
        resolve_linear_method("auto", {}, SimpleNamespace(quantization_config=config), torch.device("cpu"))


def test_fp8_block_experts_and_unquantized_router_of_a_deepseek_style_checkpoint():
    """``quant_method: fp8`` + ``weight_block_size`` (DeepSeek-V3, Qwen3-FP8): expert tiles under ``weight_scale_inv``
    are dequantized for the float MoE executor; a router the producer left in bf16 passes through."""
    from nanocore.loader.float_modules import dequantize_float_modules
    from nanocore.toolkit.gemm_block import dequantize_blocks
    from nanocore.toolkit.numerics import quantize_fp8_blocks

    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    q, scale = quantize_fp8_blocks(torch.randn(200, 160))
    router = torch.randn(4, 160, dtype=torch.bfloat16)
    stream = [("model.layers.0.mlp.experts.0.down_proj.weight_scale_inv", scale),
              ("model.layers.0.mlp.gate.weight", router),
              ("model.layers.0.mlp.experts.0.down_proj.weight", q),
              ("model.layers.0.self_attn.o_proj.weight", q)]  # a linear-method layer: untouched
    out = dict(dequantize_float_modules(stream, config))
    assert torch.equal(out["model.layers.0.mlp.experts.0.down_proj.weight"], dequantize_blocks(q, scale, (128, 128)))
    assert out["model.layers.0.mlp.gate.weight"] is router and out["model.layers.0.self_attn.o_proj.weight"] is q
    assert len(out) == 3


def test_deepseek_style_fp8_block_checkpoint_loads_with_auto(tmp_path):
    """The llm-compressor FP8_BLOCK tensors relabelled as DeepSeek-V3 writes them (``quant_method: fp8``,
    ``weight_block_size``, ``weight_scale_inv``): auto picks fp8_w8a16 and the logits are the same."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "deepseek_style"
    shutil.copytree(PRODUCERS / "llama_fp8_block", folder)
    tensors = load_file(folder / "model.safetensors")
    renamed = {(k + "_inv" if k.endswith(".weight_scale") else k): v.float() if k.endswith("_scale") else v
               for k, v in tensors.items()}
    save_file(renamed, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config))
    loaded, ours, reference = producer_logits(folder, "auto")
    assert loaded.linear_method == "fp8_w8a16"
    assert ((ours - reference).abs().max() / reference.abs().max()).item() <= 1e-4
