"""Checkpoints as other tools write them: a method whose ``quant_method`` names one of these formats must load
them too, not only what its own ``quantize`` writes (a private nibble order or scale layout round-trips through
its own ``quantize`` and still misreads every checkpoint made elsewhere).

A writer takes one layer's float tensors and the method's declared scheme, and returns (checkpoint tensors,
``quantization_config``, the ``QuantArgs`` its weights were rounded with), or None when it cannot write what the
scheme declares.
"""
from __future__ import annotations

from dataclasses import asdict

import torch

from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.toolkit.checkpoint_support import compressed_tensors_config
from nanocore.toolkit.int_packing import pack_quantized_tensors
from nanocore.toolkit.numerics import FP8_MAX, awq_pack, quantize_fp8, quantize_fp8_per_row, quantize_int8_per_row


def _linears(weights: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, t in weights.items() if n.endswith("proj.weight") and t.dim() == 2]


def fp8_per_channel(weights, scheme):
    """fp8 e4m3 ``weight`` and a float32 ``weight_scale [N, 1]`` (absmax / 448), dynamic activations."""
    out = dict(weights)
    for name in _linears(weights):
        out[name], out[name + "_scale"] = quantize_fp8_per_row(weights[name])
    return out, {"quant_method": "fp8", "activation_scheme": "dynamic"}, QuantArgs(8, "float", "channel")


def fp8_per_tensor(weights, scheme):
    """fp8 with one scalar ``weight_scale`` per checkpoint tensor (q, k and v each their own), as many fp8
    checkpoints store it: the merged layer must spread each over its own shard's rows."""
    out = dict(weights)
    for name in _linears(weights):
        scale = (weights[name].float().abs().amax() / FP8_MAX).clamp_min(1e-12)
        out[name], out[name + "_scale"] = quantize_fp8(weights[name], scale), scale.reshape(())
    return out, {"quant_method": "fp8", "activation_scheme": "dynamic"}, QuantArgs(8, "float", "tensor")


def autoawq_gemm(weights, scheme):
    """AutoAWQ GEMM: ``qweight [K, N/8]`` (AutoAWQ's interleaved nibbles), ``qzeros``, fp16 ``scales``."""
    group = scheme.weights.group_size if scheme and scheme.weights and scheme.weights.group_size else 128
    out = dict(weights)
    for name in _linears(weights):
        prefix = name[: -len("weight")]
        out.update({prefix + key: t for key, t in awq_pack(out.pop(name).float(), group).items()})
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return out, config, QuantArgs(4, "int", "group", group_size=group, symmetric=False)


def compressed_int8(weights, scheme: QuantScheme | None):
    """compressed-tensors ``int-quantized``: int8 ``weight`` and ``weight_scale [N, 1]``, channel-wise symmetric."""
    if scheme is None or scheme.weights != QuantArgs(8, "int", "channel"):
        return None
    out = dict(weights)
    for name in _linears(weights):
        out[name], out[name + "_scale"] = quantize_int8_per_row(weights[name])
    group = {"targets": ["Linear"], "weights": _config_args(scheme.weights),
             "input_activations": _config_args(scheme.input_activations)}
    config = {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
              "config_groups": {"group_0": group}, "ignore": []}
    return out, config, scheme.weights


def compressed_w8a16_channel(weights, scheme: QuantScheme | None):
    """llm-compressor's channel-wise W8A16 (``pack-quantized``: int8 four to an int32 ``weight_packed``,
    ``weight_scale [N, 1]``, ``weight_shape``): weight-only, whatever activations the method rounds otherwise."""
    weight_args = QuantArgs(8, "int", "channel")
    if scheme is None or scheme.weights != weight_args:
        return None
    out = dict(weights)
    for name in _linears(weights):
        w = out.pop(name)
        out.update({name[: -len("weight")] + key: t for key, t in pack_quantized_tensors(w, 8, w.shape[1], True).items()})
    return out, compressed_tensors_config(QuantScheme(weight_args), "pack-quantized"), weight_args


def _config_args(args: QuantArgs | None) -> dict | None:
    if args is None:
        return None
    return {k: v for k, v in asdict(args).items() if k != "block_structure" or v is not None}


#: quant_method -> the writers of checkpoints made elsewhere in that format
WRITERS = {"fp8": (fp8_per_channel, fp8_per_tensor), "awq": (autoawq_gemm,), "compressed-tensors": (compressed_int8,)}
#: quant_method -> writers of formats a method must load when its checkpoint_support accepts their config
CLAIMED_WRITERS = {"compressed-tensors": (compressed_w8a16_channel,)}
