"""Linear methods the suite must accept (CORRECT) and reject (MUTANTS), written as a third party would: from
``nanocore.interfaces`` and torch alone (or subclassing the ``unquantized`` oracle)."""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from nanocore.toolkit.reference import UnquantizedLinearMethod
from nanocore.interfaces import LinearMethod, set_weight_attrs
from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore_conformance import LinearMethodConformance, bind_all

INT4_MAX, GROUP, PACK = 15, 128, 8


def linear_weights(weights: dict[str, torch.Tensor]) -> list[str]:
    """The checkpoint tensors this author quantizes: 2-D ``*.weight`` (norms are 1-D)."""
    return [n for n, t in weights.items() if n.endswith(".weight") and t.dim() == 2]


def add_param(layer, name, shape, dtype, weight_loader, **dims):
    param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    set_weight_attrs(param, {"weight_loader": weight_loader, **dims})
    layer.register_parameter(name, param)
    return param


def check_input(layer, x):
    if x.shape[-1] != layer.input_size_per_partition:
        raise ValueError(f"input has {x.shape[-1]} features, the layer expects {layer.input_size_per_partition}")


class PlainLinear(UnquantizedLinearMethod):
    """The oracle itself, seen as a third party's class."""


class ChannelInt8(LinearMethod):
    """int8 weights, one symmetric scale per output channel, dequantized before ``F.linear``."""

    quant_method = "channel-int8"

    def quant_scheme(self):
        return QuantScheme(weights=QuantArgs(8, "int", "channel"))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        n = sum(output_partition_sizes)
        add_param(layer, "weight", (n, input_size_per_partition), torch.int8, weight_loader, output_dim=0, input_dim=1)
        add_param(layer, "weight_scale", (n, 1), torch.float32, weight_loader, output_dim=0)

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        return F.linear(x, (layer.weight.float() * layer.weight_scale).to(x.dtype), bias)

    @classmethod
    def scales(cls, w: torch.Tensor) -> torch.Tensor:
        return w.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127

    @classmethod
    def quantize(cls, weights, calibration=None):
        out = dict(weights)
        for name in linear_weights(weights):
            scale = cls.scales(weights[name])
            out[name] = (weights[name].float() / scale).round().clamp(-127, 127).to(torch.int8)
            out[name + "_scale"] = scale
        return out, {"quant_method": cls.quant_method}


class TensorInt8(ChannelInt8):
    """int8 weights with one scale per checkpoint tensor, spread over its merged shard's rows when loaded."""

    quant_method = "tensor-int8"

    def quant_scheme(self):
        return QuantScheme(weights=QuantArgs(8, "int", "tensor"))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        super().create_weights(layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                               params_dtype, weight_loader)
        layer.weight_scale.weight_loader = self.spread_scale(layer)

    def spread_scale(self, layer):
        def load(param, loaded, shard_id=None):
            index = 0 if shard_id is None else layer.shard_ids.index(shard_id)
            start = sum(layer.output_partition_sizes[:index])
            param.data[start:start + layer.output_partition_sizes[index]] = loaded.reshape(())
        return load

    @classmethod
    def quantize(cls, weights, calibration=None):
        out, config = super().quantize(weights, calibration)
        for name in linear_weights(weights):
            out[name + "_scale"] = out[name + "_scale"].reshape(1)
        return out, config

    @classmethod
    def scales(cls, w):
        return w.float().abs().amax().clamp_min(1e-12).reshape(1, 1) / 127


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int4 values ``[N, K]`` -> int32 ``[N, K / 8]``, column ``8w + j`` in bits ``4j..4j+3`` of word ``w``."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return (q.to(torch.int32).reshape(q.shape[0], -1, PACK) << shifts).sum(dim=-1, dtype=torch.int32)


def unpack_nibbles(packed: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    return ((packed.unsqueeze(-1) >> shifts.to(packed.device)) & 0xF).reshape(packed.shape[0], -1)


class GroupInt4(LinearMethod):
    """int4 weights packed 8 per int32 along K, asymmetric: a scale and a zero point per 128 inputs of a row."""

    quant_method = "group-int4"
    conformance_requirements = {"input_size_multiple": GROUP}
    nibble_shifts: ClassVar[torch.Tensor] = torch.arange(0, 32, 4, dtype=torch.int32)

    def quant_scheme(self):
        return QuantScheme(weights=QuantArgs(4, "int", "group", group_size=GROUP, symmetric=False))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        n, k = sum(output_partition_sizes), input_size_per_partition
        if k % GROUP:
            raise ValueError(f"group-int4 needs input sizes that are multiples of {GROUP}, got {k}")
        add_param(layer, "qweight", (n, k // PACK), torch.int32, weight_loader, output_dim=0, input_dim=1,
                  packed_dim=1, packed_factor=PACK)
        add_param(layer, "scales", (n, k // GROUP), torch.float32, weight_loader, output_dim=0, input_dim=1)
        add_param(layer, "zeros", (n, k // GROUP), torch.float32, weight_loader, output_dim=0, input_dim=1)

    def group_index(self, k: int, num_groups: int, device) -> torch.Tensor:
        return torch.arange(k, device=device) // GROUP

    def zero_points(self, layer) -> torch.Tensor:
        return layer.zeros

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        q = unpack_nibbles(layer.qweight, self.nibble_shifts).float()
        g_idx = self.group_index(q.shape[1], layer.scales.shape[1], q.device)
        w = (q - self.zero_points(layer)[:, g_idx]) * layer.scales[:, g_idx]
        return F.linear(x, w.to(x.dtype), bias)

    @classmethod
    def quantize(cls, weights, calibration=None):
        out = dict(weights)
        for name in linear_weights(weights):
            q, scales, zeros = int4_groups(weights[name])
            prefix = name[: -len("weight")]
            del out[name]
            out.update({prefix + "qweight": pack_nibbles(q), prefix + "scales": scales, prefix + "zeros": zeros})
        return out, {"quant_method": cls.quant_method, "group_size": GROUP}


def int4_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 of ``w [N, K]`` per 128 inputs: values ``[N, K]``, scales and zero points ``[N, K / 128]``."""
    groups = w.float().reshape(w.shape[0], -1, GROUP)
    lo, hi = groups.amin(-1).clamp_max(0), groups.amax(-1).clamp_min(0)
    scales = ((hi - lo) / INT4_MAX).clamp_min(1e-12)
    zeros = (-lo / scales).round()
    q = (groups / scales[..., None] + zeros[..., None]).round().clamp(0, INT4_MAX).reshape(w.shape)
    return q, scales, zeros


class NaturalOrderAWQ(LinearMethod):
    """Loads "awq" checkpoints (AutoAWQ GEMM layout) but packs and unpacks nibbles in natural order 0..7, not
    AutoAWQ's 0, 2, 4, 6, 1, 3, 5, 7: its own quantize round-trips, every AutoAWQ checkpoint is misread."""

    quant_method = "awq"
    conformance_requirements: ClassVar[dict] = {"input_size_multiple": GROUP, "output_size_multiple": PACK}
    shifts: ClassVar[torch.Tensor] = torch.arange(0, 32, 4, dtype=torch.int32)

    def quant_scheme(self):
        return QuantScheme(weights=QuantArgs(4, "int", "group", group_size=GROUP, symmetric=False))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        k, n = input_size_per_partition, sum(output_partition_sizes)
        packed = {"input_dim": 0, "output_dim": 1, "packed_dim": 1, "packed_factor": PACK}
        add_param(layer, "qweight", (k, n // PACK), torch.int32, weight_loader, **packed)
        add_param(layer, "qzeros", (k // GROUP, n // PACK), torch.int32, weight_loader, **packed)
        add_param(layer, "scales", (k // GROUP, n), torch.float16, weight_loader, input_dim=0, output_dim=1)

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        q = unpack_nibbles(layer.qweight, self.shifts).float()
        zeros = unpack_nibbles(layer.qzeros, self.shifts).float().repeat_interleave(GROUP, 0)
        w_t = (q - zeros) * layer.scales.float().repeat_interleave(GROUP, 0)
        return F.linear(x, w_t.t().to(x.dtype), bias)

    @classmethod
    def quantize(cls, weights, calibration=None):
        out = dict(weights)
        for name in linear_weights(weights):
            q, scales, zeros = int4_groups(weights[name])
            prefix = name[: -len("weight")]
            del out[name]
            out.update({prefix + "qweight": pack_nibbles(q.t().contiguous()),
                        prefix + "qzeros": pack_nibbles(zeros.t().contiguous()), prefix + "scales": scales.t().half()})
        return out, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}


class ScaledLinear(UnquantizedLinearMethod):
    """Scales the weight by 1.01 (a scale 1% off)."""

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight * 1.01, bias)


class ChannelScaleOnePercentHigh(ChannelInt8):
    """Dequantizes with scales 1% high (e.g. max / 125.7 folded in where the checkpoint used max / 127)."""

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        return F.linear(x, (layer.weight.float() * layer.weight_scale * 1.01).to(x.dtype), bias)


class BiasAddedTwice(ChannelInt8):
    """Passes the bias to ``F.linear`` and adds it again (a kernel that fuses the bias, plus the usual add)."""

    def apply(self, layer, x, bias=None):
        y = super().apply(layer, x, bias)
        return y if bias is None else y + bias


class ScaleOverFirstShard(TensorInt8):
    """Spreads each merged shard's per-tensor scale over rows starting at 0, not at the shard's offset
    (k's scale lands on q's rows)."""

    def spread_scale(self, layer):
        def load(param, loaded, shard_id=None):
            index = 0 if shard_id is None else layer.shard_ids.index(shard_id)
            param.data[:layer.output_partition_sizes[index]] = loaded.reshape(())
        return load


class InputShardOfRankZero(ChannelInt8):
    """Slices row-parallel weights itself and takes the first K/tp inputs on every rank (ignores the rank)."""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        super().create_weights(layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                               params_dtype, weight_loader)
        if input_size_per_partition != input_size:
            def load(param, loaded, *shard):
                param.data.copy_(loaded[:, :input_size_per_partition])
            layer.weight.weight_loader = load


class PerTensorScaleDeclaredChannel(ChannelInt8):
    """Quantizes with one scale per tensor (written out per row) while ``quant_scheme()`` declares per channel."""

    @classmethod
    def scales(cls, w):
        return (w.float().abs().amax().clamp_min(1e-12) / 127).expand(w.shape[0], 1).clone()


class ZeroPointAsMidpoint(GroupInt4):
    """Treats the asymmetric format as symmetric: subtracts the midpoint 8 instead of the stored zero points."""

    def zero_points(self, layer):
        return torch.full_like(layer.zeros, 8.0)


class GroupSize64(GroupInt4):
    """Maps input column k to group k // 64 (its own default group size) on 128-group checkpoints, wrapping
    around the stored groups."""

    def group_index(self, k, num_groups, device):
        return torch.arange(k, device=device) // 64 % num_groups


class NibblesReversed(GroupInt4):
    """Unpacks the 8 nibbles of a word in reverse order (column 8w + j read from nibble 7 - j)."""

    nibble_shifts: ClassVar[torch.Tensor] = torch.arange(28, -4, -4, dtype=torch.int32)


CORRECT = [PlainLinear, ChannelInt8, TensorInt8, GroupInt4]
MUTANTS = [ScaledLinear, ChannelScaleOnePercentHigh, BiasAddedTwice, ScaleOverFirstShard, InputShardOfRankZero,
           PerTensorScaleDeclaredChannel, ZeroPointAsMidpoint, GroupSize64, NibblesReversed, NaturalOrderAWQ]
bind_all(globals(), LinearMethodConformance, CORRECT + MUTANTS)
