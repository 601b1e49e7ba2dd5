"""Linear methods whose declared ``checkpoint_support`` the suite must accept (CORRECT) or reject (MUTANTS), written
as a third party would: ``nanocore.interfaces``, ``nanocore.toolkit`` and torch (one extends the int8_w8a8 plugin)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from nanocore_conformance import LinearMethodConformance, bind_all

from nanocore.interfaces import LinearMethod, set_weight_attrs
from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.toolkit.checkpoint_support import compressed_tensors_config, int8_support
from nanocore_int8 import Int8W8A8LinearMethod


def add_param(layer, name, shape, dtype, weight_loader, **dims):
    param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    set_weight_attrs(param, {"weight_loader": weight_loader, **dims})
    layer.register_parameter(name, param)


def static_activations(quantization_config) -> bool:
    """Whether a compressed-tensors config gives activations one static scale (an ``input_scale`` per linear)."""
    groups = (quantization_config or {}).get("config_groups", {}).values()
    return any((group.get("input_activations") or {}).get("dynamic") is False for group in groups)


class CompressedTensorsInt8(LinearMethod):
    """Loads llm-compressor's int8 checkpoints (int-quantized, channel-wise, symmetric), runs them weight-only;
    refuses those with static activation scales, whose ``input_scale`` tensors it has no parameter for."""

    quant_method = "compressed-tensors"

    @classmethod
    def checkpoint_support(cls, quantization_config):
        if static_activations(quantization_config):
            return f"{cls.__name__} runs weight-only and loads no input_scale: static activation scales are refused"
        return int8_support(cls.__name__, quantization_config)

    def quant_scheme(self):
        return QuantScheme(weights=QuantArgs(8, "int", "channel"))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        n = sum(output_partition_sizes)
        add_param(layer, "weight", (n, input_size_per_partition), torch.int8, weight_loader, output_dim=0, input_dim=1)
        add_param(layer, "weight_scale", (n, 1), torch.float32, weight_loader, output_dim=0)

    def apply(self, layer, x, bias=None):
        if x.shape[-1] != layer.weight.shape[1]:
            raise ValueError(f"input has {x.shape[-1]} features, the layer expects {layer.weight.shape[1]}")
        return F.linear(x, (layer.weight.float() * layer.weight_scale).to(x.dtype), bias)

    @classmethod
    def quantize(cls, weights, calibration=None):
        out = dict(weights)
        for name, w in weights.items():
            if name.endswith("proj.weight") and w.dim() == 2:
                scale = w.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
                out[name] = (w.float() / scale).round().clamp(-127, 127).to(torch.int8)
                out[name + "_scale"] = scale
        return out, compressed_tensors_config(QuantScheme(QuantArgs(8, "int", "channel")), "int-quantized")


class StaticInt8(CompressedTensorsInt8):
    """Also quantizes with calibration: one static int8 scale per input (``input_scale``, the largest of merged
    shards), activations rounded to it; the checkpoint says so (static ``input_activations``)."""

    def __init__(self, options=None):
        super().__init__(options)
        self.static = static_activations(self.options.get("quantization_config"))

    @classmethod
    def checkpoint_support(cls, quantization_config):
        return int8_support(cls.__name__, quantization_config)

    def quant_scheme(self):
        return QuantScheme(QuantArgs(8, "int", "channel"), QuantArgs(8, "int", "tensor") if self.static else None)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        super().create_weights(layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                               params_dtype, weight_loader)
        if self.static:
            scale = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
            set_weight_attrs(scale, {"weight_loader": lambda p, t, *a: p.data.copy_(torch.maximum(p, t.reshape(1)))})
            layer.register_parameter("input_scale", scale)

    def apply(self, layer, x, bias=None):
        if self.static:
            s = layer.input_scale
            x = ((x.float() / s).round().clamp(-127, 127) * s).to(x.dtype)
        return super().apply(layer, x, bias)

    @classmethod
    def quantize(cls, weights, calibration=None):
        out, config = super().quantize(weights)
        if not calibration:
            return out, config
        for name, w in weights.items():
            if name.endswith("proj.weight") and w.dim() == 2:
                prefix = name[: -len(".weight")]
                out[prefix + ".input_scale"] = (calibration[prefix].float().abs().amax() / 127).reshape(1)
        return out, cls.static_config()

    @staticmethod
    def static_config():
        return compressed_tensors_config(QuantScheme(QuantArgs(8, "int", "channel"), QuantArgs(8, "int", "tensor")),
                                         "int-quantized")


class StaticConfigWithoutInputScale(StaticInt8):
    """With calibration, writes the static config but forgets the ``input_scale`` tensors it computed."""

    @classmethod
    def quantize(cls, weights, calibration=None):
        out, config = CompressedTensorsInt8.quantize.__func__(cls, weights)
        return out, cls.static_config() if calibration else config


class ClaimsStaticInt8(CompressedTensorsInt8):
    """Claims every int8 checkpoint int8_support accepts, static activation scales included, which it has no
    ``input_scale`` parameter for (the model loader fails on the checkpoint's tensor)."""

    @classmethod
    def checkpoint_support(cls, quantization_config):
        return int8_support(cls.__name__, quantization_config)


class RoundsActivationsOfW8A16(Int8W8A8LinearMethod):
    """int8_w8a8 that loads weight-only (W8A16) checkpoints, as it claims, but still rounds every token to int8."""

    def apply(self, layer, x, bias=None):
        if self.activation_scheme == "none":
            scale = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127
            x = ((x.float() / scale).round() * scale).to(x.dtype)
        return super().apply(layer, x, bias)


class ClaimsEveryCompressedTensors(CompressedTensorsInt8):
    """Says it loads every compressed-tensors checkpoint (fp8, packed int4 ...) because its quant_method matches."""

    @classmethod
    def checkpoint_support(cls, quantization_config):
        return None if (quantization_config or {}).get("quant_method") == "compressed-tensors" else "not mine"


class RefusesItsOwnCheckpoints(CompressedTensorsInt8):
    """Checks for the ``int-quantized`` format at the top level only, which its own quantize does not write."""

    @classmethod
    def checkpoint_support(cls, quantization_config):
        return None if (quantization_config or {}).get("format") == "naive-quantized" else "wrong format"


class EmptyReason(CompressedTensorsInt8):
    """Refuses with an empty string, which reads as 'no reason' in every error message."""

    @classmethod
    def checkpoint_support(cls, quantization_config):
        return int8_support(cls.__name__, quantization_config) and ""


CORRECT = [CompressedTensorsInt8, StaticInt8]
MUTANTS = [ClaimsEveryCompressedTensors, RefusesItsOwnCheckpoints, EmptyReason, StaticConfigWithoutInputScale,
           ClaimsStaticInt8, RoundsActivationsOfW8A16]
bind_all(globals(), LinearMethodConformance, CORRECT + MUTANTS)
