"""``awq``: 4-bit weights in the AutoAWQ GEMM format (group-wise scales and zero points), bf16/fp16 activations.

Checkpoint (``quantization_config = {"quant_method": "awq", "bits": 4, "group_size": 128,
"zero_point": true, "version": "gemm"}``): ``<prefix>.qweight`` int32 ``[K, N/8]``, ``<prefix>.qzeros``
int32 ``[K/g, N/8]``, ``<prefix>.scales`` float16 ``[K/g, N]``. The output dim is dim 1 and is packed.
"""
from __future__ import annotations

from typing import Any

import torch

from nanocore.interfaces import LinearMethod, QuantArgs, QuantScheme, check_options, choice_option
from nanocore.toolkit.capability import cuda_capability_reason
from nanocore.toolkit.checkpoint import (
    CheckpointFormatError,
    add_param,
    check_all_loaded,
    config_option,
    quantizable_linears,
    tensor_name,
)
from nanocore.toolkit.checkpoint_support import awq_support
from nanocore.toolkit.gemm import gemm_input_rows
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, switch_points
from nanocore.toolkit.numerics import AWQ_PACK_FACTOR, awq_pack
from nanocore_awq.kernels import run_awq_kernel
from nanocore_awq.search import apply_awq_scales

_OPTIONS = {"group_size": int, "kernel": str, "quantization_config": dict}
_TENSORS = ("qweight", "qzeros", "scales")


class AWQLinearMethod(LinearMethod):
    """W4A16, AutoAWQ GEMM layout: a CUDA C++ GEMV for M <= 4, Triton kernels beyond; int4 unpacked in registers."""

    quant_method = "awq"
    #: The kernel per M and the M values where it changes (``toolkit.kernel_plan``; tests run each side).
    kernel_plan = KERNEL_PLANS["int4_group"]
    kernel_thresholds = switch_points(kernel_plan)

    @classmethod
    def checkpoint_support(cls, quantization_config):
        """AutoAWQ GEMM checkpoints: 4-bit, zero point, group-wise."""
        return awq_support(cls.__name__, quantization_config)
    tolerance = (0.16, 0.05)  # int4 rounds to 1/30 of a group's range; measured worst 0.14 of max|y|
    #: The shared suite draws K in groups of 128 and N in packs of 8 for this method.
    conformance_requirements = {"input_size_multiple": 128, "output_size_multiple": 8}

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        check_options(self.name, self.options, _OPTIONS)
        self.group_size = int(config_option(self.options, "group_size", 128))
        self.kernel = choice_option("awq", self.options, "kernel", ("auto", "cuda", "triton", "torch"))
        config = self.options.get("quantization_config") or {}
        bits, zero_point = config.get("bits", config.get("w_bit", 4)), config.get("zero_point", True)
        version = str(config.get("version", "gemm")).lower()
        if bits != 4 or not zero_point or version != "gemm":
            raise CheckpointFormatError(f"awq loads 4-bit, zero-point, GEMM-version AutoAWQ checkpoints; this one "
                                        f"has bits={bits}, zero_point={zero_point}, version={version!r}")
        if self.group_size <= 0 or self.group_size % 32:
            raise ValueError(f"awq: group_size must be a positive multiple of 32 (128 is standard), got {self.group_size}")

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        if device.type == "cpu":
            return None
        if device.type == "cuda":
            return cuda_capability_reason(device, (8, 0), "awq (Triton int4 kernels)")
        return f"awq runs on CPU (torch reference) or NVIDIA GPUs, not {device.type}"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        k, n, g = input_size_per_partition, sum(output_partition_sizes), self.group_size
        if k % g:
            raise CheckpointFormatError(f"awq: input size per partition {k} is not a multiple of group_size {g}; "
                                        f"use a smaller tensor-parallel size or another group size")
        if any(p % AWQ_PACK_FACTOR for p in output_partition_sizes):
            raise ValueError(f"awq: output sizes {output_partition_sizes} must be multiples of {AWQ_PACK_FACTOR}")
        packed = dict(input_dim=0, output_dim=1, packed_dim=1, packed_factor=AWQ_PACK_FACTOR)
        add_param(layer, "qweight", (k, n // AWQ_PACK_FACTOR), torch.int32, weight_loader, "awq",
                  full_input=input_size, **packed)
        add_param(layer, "qzeros", (k // g, n // AWQ_PACK_FACTOR), torch.int32, weight_loader, "awq",
                  full_input=input_size // g, **packed)
        scales_dtype = torch.float16 if params_dtype == torch.float32 else params_dtype
        add_param(layer, "scales", (k // g, n), scales_dtype, weight_loader, "awq", full_input=input_size // g,
                  input_dim=0, output_dim=1)

    def quant_scheme(self) -> QuantScheme:
        """int4 weights, a scale and a zero point per ``group_size`` inputs of a row; activations not rounded."""
        return QuantScheme(weights=QuantArgs(4, "int", "group", group_size=self.group_size, symmetric=False))

    def process_weights_after_loading(self, layer):
        check_all_loaded(layer, list(_TENSORS), "awq")

    def apply(self, layer, x, bias=None):
        gemm_input_rows(x, layer.qweight.shape[0], "awq's layer")  # a wrong K is a clear error on either path
        return run_awq_kernel(self.kernel, "awq", x, layer.qweight, layer.qzeros, layer.scales, bias)

    @classmethod
    def quantize(cls, weights, calibration=None, group_size: int = 128):
        """AWQ scale search when calibration activations are given, plain round-to-nearest otherwise."""
        targets = quantizable_linears(weights)
        scaled = dict(weights)
        if calibration:
            scaled.update(apply_awq_scales(weights, calibration, targets, group_size))
        out = {name: t for name, t in scaled.items()
               if not any(name == tensor_name(p, "weight") for p in targets)}
        for prefix in targets:
            w = scaled[tensor_name(prefix, "weight")]
            if w.shape[1] % group_size or w.shape[0] % AWQ_PACK_FACTOR:
                raise ValueError(f"awq: {prefix or 'weight'} of shape {tuple(w.shape)} needs input size a multiple "
                                 f"of {group_size} and output size a multiple of {AWQ_PACK_FACTOR}; add it to the "
                                 f"ignore list")
            for name, t in awq_pack(w, group_size).items():
                out[tensor_name(prefix, name)] = t
        return out, {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                     "version": "gemm", "modules_to_not_convert": [], "awq_scale_search": bool(calibration)}
