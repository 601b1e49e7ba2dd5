"""``wna16``: packed int4 / int8 weight-only checkpoints that others write, on the AWQ kernels where they fit.

Loads compressed-tensors ``pack-quantized`` (llm-compressor W4A16 / W8A16: ``weight_packed``, ``weight_scale``,
``weight_zero_point`` when asymmetric, ``weight_shape``, ``weight_g_idx`` with group act-order) and GPTQ
(``qweight`` / ``qzeros`` / ``scales`` / ``g_idx``, desc_act included). After loading, int4 weights are repacked
into the AutoAWQ GEMM layout and run on ``awq``'s kernels (act-order: input channels permuted once so groups are
contiguous, the activations gathered the same way); int8 weights dequantize in ``apply`` (torch). ``auto`` sends
symmetric channel-wise 8-bit (llm-compressor W8A16 channel) to ``int8_w8a16``, whose kernels read int8; here it
still loads by name, and group-wise or asymmetric 8-bit stay here.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from nanocore.interfaces import LinearMethod, check_options, choice_option
from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.toolkit.capability import cuda_capability_reason
from nanocore.toolkit.checkpoint import (
    CheckpointFormatError,
    check_all_loaded,
    quantizable_linears,
    tensor_name,
)
from nanocore.toolkit.checkpoint_formats import parse_quantization_config
from nanocore.toolkit.checkpoint_support import (
    compressed_tensors_config,
    weight_only_int_support,
)
from nanocore.toolkit.gemm import gemm_input_rows
from nanocore.toolkit.int_packing import dequantize_int, pack_quantized_tensors
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, switch_points
from nanocore.toolkit.numerics import AWQ_PACK_FACTOR, pack_int4_awq
from nanocore_awq.kernels import run_awq_kernel
from nanocore_awq.wna16_layouts import LAYOUTS, canonical_tensors

_OPTIONS = {"kernel": str, "quantization_config": dict}


class WNA16LinearMethod(LinearMethod):
    """W4A16 / W8A16 from compressed-tensors pack-quantized and GPTQ checkpoints (group or channel, any zero)."""

    quant_method = "compressed-tensors"
    checkpoint_priority = 0
    #: The kernel per M and the M values where it changes (``toolkit.kernel_plan``; tests run each side).
    kernel_plan = KERNEL_PLANS["int4_group"]
    kernel_thresholds = switch_points(kernel_plan)
    conformance_requirements = {"input_size_multiple": 128, "output_size_multiple": 8}

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        check_options(self.name, self.options, _OPTIONS)
        self.kernel = choice_option(self.name, self.options, "kernel", ("auto", "cuda", "triton", "torch"))
        config = self.options.get("quantization_config")
        reason = self.checkpoint_support(config) if config else None
        if reason:
            raise CheckpointFormatError(f"{self.name}: {reason}")
        fmt = parse_quantization_config(config) if config else None
        group = fmt.uniform_group() if fmt else None
        self.layout = "gptq" if fmt is not None and fmt.producer == "gptq" else "compressed-tensors"
        self.weights = group.scheme.weights if group else QuantArgs(4, "int", "group", 128, symmetric=True)
        self.actorder = group.actorder if group else None

    @classmethod
    def checkpoint_support(cls, quantization_config):
        """compressed-tensors pack-quantized and GPTQ (v1 and v2 zero points): int4 / int8 weights, group or channel,
        weight-only."""
        return weight_only_int_support(cls.__name__, quantization_config,
                                       formats=("pack-quantized", "gptq", "gptq_v2"))

    def quant_scheme(self) -> QuantScheme:
        return QuantScheme(weights=self.weights)

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        if device.type == "cpu":
            return None
        if device.type == "cuda":
            return cuda_capability_reason(device, (8, 0), "wna16 (Triton int4 kernels)")
        return f"wna16 runs on CPU (torch) or NVIDIA GPUs, not {device.type}"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        self.input_size, self.params_dtype = input_size_per_partition, params_dtype
        self.partitions = list(output_partition_sizes)
        self.names = LAYOUTS[self.layout](self, layer, input_size_per_partition, output_partition_sizes, input_size,
                                         weight_loader)

    def process_weights_after_loading(self, layer):
        check_all_loaded(layer, self.names, self.name)
        q, scales, zeros, g_idx = canonical_tensors(self, layer)
        for name in self.names:
            delattr(layer, name)
        self.perm = None
        one_order = g_idx is None or g_idx.dim() == 1  # q, k and v act-orders differ: no single permutation
        if self.weights.num_bits == 4 and q.shape[0] % AWQ_PACK_FACTOR == 0 and one_order:
            if g_idx is not None:  # act-order: sort input channels by group once, gather x the same way in apply
                self.perm = torch.argsort(g_idx.long(), stable=True).to(q.device)
                q = q[:, self.perm]
            k, groups = q.shape[1], scales.shape[1]
            scale_dtype = self.params_dtype  # float32 models dequantize in float32 (AutoAWQ's fp16 rounds again)
            tensors = {"qweight": pack_int4_awq(q.t().contiguous()), "qzeros": pack_int4_awq(zeros.t().contiguous()),
                       "scales": scales.t().contiguous().to(scale_dtype)}
            if k % groups:
                raise CheckpointFormatError(f"{self.name}: {groups} groups do not divide input size {k}")
        else:
            tensors = {"q": q.to(torch.uint8 if self.weights.num_bits <= 8 else torch.int32),
                       "scales": scales.float(), "zeros": zeros.to(torch.int16)}
            if g_idx is not None:
                tensors["g_idx"] = g_idx.long()
        for name, t in tensors.items():
            layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))

    def apply(self, layer, x, bias=None):
        gemm_input_rows(x, self.input_size, f"{self.name}'s layer")  # a wrong K is a clear error on every path
        if not hasattr(layer, "qweight"):
            return F.linear(x, self._dequantized(layer, x.dtype), bias)
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return run_awq_kernel(self.kernel, self.name, x, layer.qweight, layer.qzeros, layer.scales, bias)

    def _dequantized(self, layer, dtype: torch.dtype) -> torch.Tensor:
        """The float weight (int8, or int4 whose merged shards have different act-orders: per shard)."""
        g_idx = getattr(layer, "g_idx", None)
        if g_idx is None or g_idx.dim() == 1:
            return dequantize_int(layer.q, layer.scales, layer.zeros, g_idx, dtype)
        rows = torch.tensor([0] + self.partitions).cumsum(0).tolist()
        return torch.cat([dequantize_int(layer.q[a:b], layer.scales[a:b], layer.zeros[a:b], g_idx[i], dtype)
                          for i, (a, b) in enumerate(zip(rows[:-1], rows[1:]))])

    @classmethod
    def quantize(cls, weights, calibration=None, group_size: int = 128):
        """Round-to-nearest int4, symmetric, one scale per ``group_size`` inputs, written as compressed-tensors
        pack-quantized, as llm-compressor's W4A16 writes it (symmetric: transformers 5.24 with compressed-tensors
        0.20 fails on the packed zero points of asymmetric checkpoints, llm-compressor's own included)."""
        if calibration:
            raise ValueError(f"{cls.name} quantize is plain round-to-nearest; for activation-aware scales make an "
                             f"AutoAWQ checkpoint with --method awq")
        targets = quantizable_linears(weights)
        out = {n: t for n, t in weights.items() if not any(n == tensor_name(p, "weight") for p in targets)}
        for prefix in targets:
            w = weights[tensor_name(prefix, "weight")]
            for name, t in pack_quantized_tensors(w, 4, group_size, symmetric=True).items():
                out[tensor_name(prefix, name)] = t
        scheme = QuantScheme(weights=QuantArgs(4, "int", "group", group_size, symmetric=True))
        return out, compressed_tensors_config(scheme, "pack-quantized")
