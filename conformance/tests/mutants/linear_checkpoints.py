"""Linear methods whose declared ``checkpoint_support`` the suite must accept (CORRECT) or reject (MUTANTS), written
as a third party would: ``nanocore.interfaces``, ``nanocore.toolkit`` and torch."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from nanocore_conformance import LinearMethodConformance, bind_all

from nanocore.interfaces import LinearMethod, set_weight_attrs
from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.toolkit.checkpoint_support import compressed_tensors_config, int8_support


def add_param(layer, name, shape, dtype, weight_loader, **dims):
    param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    set_weight_attrs(param, {"weight_loader": weight_loader, **dims})
    layer.register_parameter(name, param)


class CompressedTensorsInt8(LinearMethod):
    """Loads llm-compressor's int8 checkpoints (int-quantized, channel-wise, symmetric), runs them weight-only."""

    quant_method = "compressed-tensors"

    @classmethod
    def checkpoint_support(cls, quantization_config):
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


CORRECT = [CompressedTensorsInt8]
MUTANTS = [ClaimsEveryCompressedTensors, RefusesItsOwnCheckpoints, EmptyReason]
bind_all(globals(), LinearMethodConformance, CORRECT + MUTANTS)
