"""The declared capability ``checkpoint_support``: what a linear method says it loads, it loads.

A catalog of the ecosystem's formats (llm-compressor's compressed-tensors schemes, vLLM fp8, AutoAWQ GEMM), each a
``quantization_config`` plus the tensors its producer writes for a decoder layer. For every entry a method accepts,
the layer must load those tensors through its ``weight_loader``s and compute ``x W^T`` for the weights the tensors
hold; for every entry it refuses, the answer must be a reason. Its own ``quantize`` output must be accepted.
"""
from __future__ import annotations

import torch

from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.toolkit.checkpoint_support import (
    compressed_tensors_config,
    fp8_checkpoint_config,
)
from nanocore.toolkit.int_packing import (
    dequantize_int,
    pack_quantized_tensors,
    quantize_int_groups,
)
from nanocore.toolkit.numerics import (
    awq_dequantize,
    awq_pack,
    expand_block_scales,
    quantize_fp8_blocks,
    quantize_fp8_per_row,
    quantize_int8_per_row,
)
from nanocore_conformance.base import generator
from nanocore_conformance.linear_layers import (
    MODULES,
    PREFIX,
    ROW_PARALLEL,
    LayerShape,
    build_layers,
    checkpoint_weights,
    load_checkpoint,
    method_options,
    quantize_layer,
)

#: K multiple of 128 (group formats), N multiple of 8 (packed zero points); one TP rank.
SHAPE = LayerShape(hidden=256, head_dim=32, num_heads=4, num_kv_heads=2, intermediate=256, qkv_bias=False)
#: Its own quantize runs on a smaller layer (the fp8 scale search is slow on CPU).
SMALL = LayerShape(hidden=128, head_dim=32, num_heads=4, num_kv_heads=2, intermediate=128, qkv_bias=False)
#: Largest |y - y_ref| / max|y_ref| for a loader that reads the format right (activation rounding included).
LOAD_TOLERANCE = 0.12


def _fp8_channel(w):
    q, scale = quantize_fp8_per_row(w)
    return {"weight": q, "weight_scale": scale.to(torch.bfloat16)}, q.float() * scale.to(torch.bfloat16).float()


def _fp8_tensor(w):
    scale = (w.abs().max() / 448).reshape(1)
    q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale, "input_scale": torch.ones(1)}, q.float() * scale


def _fp8_block(w):
    q, tiles = quantize_fp8_blocks(w, (128, 128))  # one scale per 128 x 128 tile (partial tiles at the edges)
    tiles = tiles.to(torch.bfloat16)  # as llm-compressor stores them
    return {"weight": q, "weight_scale": tiles}, q.float() * expand_block_scales(tiles, w.shape, (128, 128))


def _int8_channel(w):
    q, scale = quantize_int8_per_row(w)
    return {"weight": q, "weight_scale": scale}, q.float() * scale


def _int8_channel_static(w):
    tensors, held = _int8_channel(w)
    # one static scale per input covering |x| <= 8 (the check's activations are standard normal)
    return {**tensors, "input_scale": torch.full((1,), 8.0 / 127)}, held


def _packed(bits, group, symmetric):
    """``group`` None: channel-wise (one group of the whole row)."""
    def write(w):
        size = group or w.shape[1]
        tensors = pack_quantized_tensors(w, bits, size, symmetric)
        q, scales, zeros = quantize_int_groups(w, bits, size, symmetric)
        return tensors, dequantize_int(q, scales.to(w.dtype).float(), zeros)
    return write


def _awq(w):
    tensors = awq_pack(w, 128)
    return tensors, awq_dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"]).float().t()


def _ct(weights, activations=None, fmt="pack-quantized"):
    return compressed_tensors_config(QuantScheme(weights, activations), fmt)


_DYNAMIC_INT8 = QuantArgs(8, "int", "token", dynamic=True)
#: name -> (quantization_config, writer(float weight [N, K]) -> (tensors, the float weight they hold))
CATALOG = {
    "llm-compressor FP8_DYNAMIC": (fp8_checkpoint_config("dynamic"), _fp8_channel),
    "llm-compressor FP8 (static, per tensor)": (
        _ct(QuantArgs(8, "float", "tensor"), QuantArgs(8, "float", "tensor"), "float-quantized"), _fp8_tensor),
    "llm-compressor FP8_BLOCK": (
        _ct(QuantArgs(8, "float", "block", block_structure=(128, 128)), QuantArgs(8, "float", "group", 128,
                                                                                 dynamic=True), "float-quantized"),
        _fp8_block),
    "vLLM fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, _fp8_channel),
    "llm-compressor W8A8 int8": (_ct(QuantArgs(8, "int", "channel"), _DYNAMIC_INT8, "int-quantized"), _int8_channel),
    "llm-compressor W8A8 int8 (static, per tensor)": (
        _ct(QuantArgs(8, "int", "channel"), QuantArgs(8, "int", "tensor"), "int-quantized"), _int8_channel_static),
    "llm-compressor W4A16": (_ct(QuantArgs(4, "int", "group", 128)), _packed(4, 128, True)),
    "llm-compressor W4A16_ASYM": (_ct(QuantArgs(4, "int", "group", 128, symmetric=False)), _packed(4, 128, False)),
    "llm-compressor W8A16": (_ct(QuantArgs(8, "int", "group", 128)), _packed(8, 128, True)),
    # channel-wise W8A16 (strategy "channel"; the 0.14 preset above is group 128): one scale per row
    "llm-compressor W8A16 channel-wise": (_ct(QuantArgs(8, "int", "channel")), _packed(8, None, True)),
    "llm-compressor W4A8 (int8 activations)": (_ct(QuantArgs(4, "int", "group", 128), _DYNAMIC_INT8),
                                               _packed(4, 128, True)),
    "AutoAWQ GEMM": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
                     _awq),
    "unknown quant_method": ({"quant_method": "imaginary-q3"}, None),
}


def catalog_checkpoint(writer, g: torch.Generator) -> tuple[dict, dict]:
    """(tensors as the producer writes them, the float weights those tensors hold) for one decoder layer."""
    weights = checkpoint_weights(SHAPE, g)
    tensors, held = {}, {}
    for name, w in weights.items():
        module = name[len(PREFIX):].rpartition(".")[0]
        if module not in MODULES:
            tensors[name] = held[name] = w
            continue
        written, float_weight = writer(w)
        tensors.update({f"{PREFIX}{module}.{suffix}": t for suffix, t in written.items()})
        held[name] = float_weight.float()
    return tensors, held


class LinearCheckpointConformance:
    """Mixed into LinearMethodConformance."""

    def test_checkpoint_support_answers_none_or_a_reason(self, backend_cls):
        for name, (config, _) in CATALOG.items():
            verdict = backend_cls.checkpoint_support(config)
            assert verdict is None or (isinstance(verdict, str) and verdict.strip()), (
                f"checkpoint_support({name}) must return None (loads it) or a reason, got {verdict!r}")

    def test_accepts_its_own_quantize_output(self, backend_cls):
        _, config = quantize_layer(backend_cls, checkpoint_weights(SMALL, generator(3)))
        verdict = backend_cls.checkpoint_support(config or None)
        assert verdict is None, (f"checkpoint_support refuses the quantization_config its own quantize writes "
                                 f"({verdict}); 'auto' would never choose it for its own checkpoints")

    def test_loads_every_format_it_claims(self, backend_cls, backend_options, dtype, device):
        from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
        for name, (config, writer) in CATALOG.items():
            if backend_cls.checkpoint_support(config) is not None:
                continue
            assert writer is not None, f"checkpoint_support claims {name}, which no method can load"
            tensors, held = catalog_checkpoint(writer, generator(5))
            options = method_options(backend_options, config)
            where = f"checkpoint_support accepts {name} but"
            try:
                layers = build_layers(lambda options=options: backend_cls(dict(options)), SHAPE, 0, 1, dtype, device)
                load_checkpoint(layers, tensors, device, backend_cls.__name__)
            except Exception as exc:  # claimed, so it must load
                raise AssertionError(f"{where} loading its tensors failed: {type(exc).__name__}: {exc}") from exc
            oracles = build_layers(UnquantizedLinearMethod, SHAPE, 0, 1, torch.float32, "cpu")
            load_checkpoint(oracles, held, "cpu", "unquantized")
            x = torch.randn(5, SHAPE.hidden, generator=generator(6))
            for layer_name, layer in layers.items():
                k = layer.input_size_per_partition if hasattr(layer, "input_size_per_partition") else x.shape[1]
                xi = torch.randn(5, k, generator=generator(7)) if layer_name in ROW_PARALLEL else x
                got = layer.linear_method.apply(layer, xi.to(dtype=dtype, device=device), None).float().cpu()
                want = oracles[layer_name].linear_method.apply(oracles[layer_name], xi, None)
                err = ((got - want).abs().max() / want.abs().max()).item()
                assert err <= LOAD_TOLERANCE, (f"{where} {layer_name} computes something else from them: largest "
                                               f"error {err:.3g} of max|y| (allowed {LOAD_TOLERANCE})")
