"""``fp8_w8a16`` (fp8 weights, bf16/fp16 activations) and ``fp8_w8a8`` (fp8 x fp8 on ``torch._scaled_mm``).

Checkpoint format (``quantization_config = {"quant_method": "fp8", "activation_scheme": ...}``):
``<prefix>.weight`` fp8 e4m3 ``[N, K]``, ``<prefix>.weight_scale`` float ``[N, 1]`` (per output channel)
or a scalar (per tensor, as other fp8 checkpoints store it), and with ``activation_scheme = "static"``
a scalar ``<prefix>.input_scale``. ``fp8_w8a16`` also loads block-wise scales, one per 128 x 128 tile
(compressed-tensors ``strategy: block`` / ``weight_scale``, or ``weight_block_size`` / ``weight_scale_inv``).
"""
from __future__ import annotations

from typing import Any

import torch

from nanocore.interfaces import LinearMethod, QuantArgs, QuantScheme, check_options, choice_option
from nanocore.toolkit.act_quant import quantize_per_token
from nanocore.toolkit.capability import cuda_capability_reason, kernel_uses_triton
from nanocore.toolkit.checkpoint import fp8_activation_scheme, fp8_weight_blocks, quantize_checkpoint_linears
from nanocore.toolkit.checkpoint_support import fp8_checkpoint_config, fp8_support
from nanocore.toolkit.gemm import gemm_input_rows
from nanocore.toolkit.gemm_block import block_scaled_linear, block_scaled_linear_torch
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, switch_points
from nanocore.toolkit.numerics import FP8_DTYPE, FP8_MAX, quantize_fp8_activations, quantize_fp8_weight
from nanocore.toolkit.weights import BlockScaledWeights, ChannelScaledWeights
from nanocore_fp8.kernels import fp8_linear_torch, fp8_linear_triton

_OPTIONS = {"kernel": str, "activation_scheme": str, "quantization_config": dict}
FP8_SCALE_METHODS = ("search", "absmax")


class _Fp8Base(LinearMethod):
    api_version = "1.6"  # held to 1.6's rules: activations rounded as quant_scheme() declares
    quant_method = "fp8"
    #: Loads block-wise fp8 scales (one per 128 x 128 tile) too.
    loads_blocks = False

    @classmethod
    def checkpoint_support(cls, quantization_config):
        """fp8 and compressed-tensors float-quantized checkpoints (per-channel / per-tensor scales; per-block with
        ``loads_blocks``)."""
        return fp8_support(cls.__name__, quantization_config, blocks=cls.loads_blocks)

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        check_options(self.name, self.options, _OPTIONS)
        self.kernel = choice_option(self.name, self.options, "kernel", ("auto", "triton", "torch"))
        self.activation_scheme = fp8_activation_scheme(self.name, self.options, blocks=self.loads_blocks)
        self.static_inputs = self.activation_scheme == "static"  # a per-tensor input_scale from the checkpoint
        #: ((rows, cols), scale tensor name) of a block-wise checkpoint, else None
        self.blocks = fp8_weight_blocks(self.options) if self.loads_blocks else None

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        if device.type in ("cpu", "cuda"):
            return None if device.type == "cpu" else cuda_capability_reason(device, (8, 0), cls.name)
        return f"{cls.name} runs on CPU (torch reference) or NVIDIA GPUs, not {device.type}"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        self.weights = ChannelScaledWeights(self.name, FP8_DTYPE, self.static_inputs)
        self.weights.create(layer, input_size_per_partition, output_partition_sizes, input_size, weight_loader)

    def process_weights_after_loading(self, layer):
        self.weights.finish(layer)

    def _use_triton(self, x: torch.Tensor) -> bool:
        return kernel_uses_triton(self.kernel, x.device, self.name)

    @classmethod
    def _quantize(cls, weights, calibration, scheme: str, fp8_scale: str = "search"):
        """Per-channel fp8 weights; ``fp8_scale``: ``search`` (default) or ``absmax`` (see ``quantize_fp8_weight``)."""
        if fp8_scale not in FP8_SCALE_METHODS:
            raise ValueError(f"{cls.name}: fp8_scale must be one of {FP8_SCALE_METHODS}, got {fp8_scale!r}")

        def quantize_weight(w, x):
            return quantize_fp8_weight(w, x, fp8_scale)
        out = quantize_checkpoint_linears(cls.name, weights, calibration, scheme == "static", quantize_weight,
                                          FP8_MAX, with_inputs=True)
        return out, fp8_checkpoint_config(scheme)  # what llm-compressor writes: transformers and vLLM read it


class Fp8W8A16LinearMethod(_Fp8Base):
    """fp8 e4m3 weights, per-channel scales; activations stay in the model dtype."""

    tolerance = (0.04, 0.04)  # e4m3 rounds to 1/16 relative; measured worst 0.039 of max|y| on random shapes
    checkpoint_priority = 1  # "auto" on an fp8 checkpoint: bf16 activations, the accurate choice
    loads_blocks = True  # the only in-tree method that does: fp8_w8a8 and cutlass name it in their reasons
    #: The kernel per M and the M values where it changes (``toolkit.kernel_plan``; tests run each side).
    kernel_plan = KERNEL_PLANS["fp8_channel"]
    kernel_thresholds = switch_points(kernel_plan)

    def quant_scheme(self) -> QuantScheme:
        """fp8 e4m3 weights, one scale per output channel (or per tile of a block-wise checkpoint); activations
        not rounded."""
        if self.blocks:
            return QuantScheme(weights=QuantArgs(8, "float", "block", block_structure=self.blocks[0]))
        return QuantScheme(weights=QuantArgs(8, "float", "channel"))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        if not self.blocks:
            return super().create_weights(layer, input_size_per_partition, output_partition_sizes, input_size,
                                          output_size, params_dtype, weight_loader)
        block, scale_name = self.blocks
        self.weights = BlockScaledWeights(self.name, FP8_DTYPE, block, scale_name, self.static_inputs)
        self.weights.create(layer, input_size_per_partition, output_partition_sizes, input_size, weight_loader,
                            output_size)

    def apply(self, layer, x, bias=None):
        if self.blocks:
            scale, layout = self.weights.scale(layer), self.weights.layout
            if self._use_triton(x):
                return block_scaled_linear(x, layer.weight, scale, layout, bias)
            return block_scaled_linear_torch(x, layer.weight, scale, layout, bias)
        if self._use_triton(x):
            return fp8_linear_triton(x, layer.weight, layer.weight_scale, bias)
        return fp8_linear_torch(x, layer.weight, layer.weight_scale, bias)

    @classmethod
    def quantize(cls, weights, calibration=None, fp8_scale: str = "search"):
        return cls._quantize(weights, calibration, "none", fp8_scale)  # weight-only: what this method computes


#: CUDA ``torch._scaled_mm`` needs K and N divisible by 16: real models' layers are; other shapes are zero-padded.
SCALED_MM_ALIGN = 16


def _aligned_for_scaled_mm(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's fp8 weight zero-padded to multiples of 16 (and its scales, padded with 1): made after loading,
    again only if the weights move to another device (never inside a CUDA-graph capture, which runs eager first)."""
    cached = getattr(layer, "_scaled_mm_aligned", None)
    if cached is None or cached[0].device != layer.weight.device:
        n, k = layer.weight.shape
        weight = torch.zeros(n + -n % SCALED_MM_ALIGN, k + -k % SCALED_MM_ALIGN, dtype=layer.weight.dtype,
                             device=layer.weight.device)
        weight[:n, :k] = layer.weight
        scale = torch.ones(weight.shape[0], dtype=torch.float32, device=layer.weight.device)
        scale[:n] = layer.weight_scale.reshape(-1).float()
        cached = layer._scaled_mm_aligned = (weight, scale)
    return cached


class Fp8W8A8LinearMethod(_Fp8Base):
    """fp8 weights and fp8 activations (per-token dynamic, or static per-tensor) on ``torch._scaled_mm``."""

    tolerance = (0.07, 0.07)  # weights and activations each round to 1/16; measured worst 0.046
    # loads the same fp8 checkpoints; "auto" picks fp8_w8a16 (higher checkpoint_priority)

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        if not hasattr(torch, "_scaled_mm"):
            return f"{cls.name} needs torch._scaled_mm (torch >= 2.4)"
        if device.type == "cuda":
            return cuda_capability_reason(device, (8, 9), f"{cls.name} (fp8 tensor cores)")
        return None if device.type == "cpu" else f"{cls.name} runs on CPU or NVIDIA GPUs, not {device.type}"

    def quant_scheme(self) -> QuantScheme:
        """fp8 e4m3 weights per output channel; fp8 activations per token (dynamic) or per tensor (static)."""
        static = self.static_inputs
        activations = QuantArgs(8, "float", "tensor" if static else "token", dynamic=not static)
        return QuantScheme(weights=QuantArgs(8, "float", "channel"), input_activations=activations)

    def process_weights_after_loading(self, layer):
        super().process_weights_after_loading(layer)
        n, k = layer.weight.shape
        if k % SCALED_MM_ALIGN or n % SCALED_MM_ALIGN:
            _aligned_for_scaled_mm(layer)

    def apply(self, layer, x, bias=None):
        n, k = layer.weight.shape
        x2, lead = gemm_input_rows(x, k, f"{self.name}'s layer")
        static = self.static_inputs
        if static or self.kernel == "torch":  # the torch ops (kernel='torch': Triton-free)
            xq, x_scale = quantize_fp8_activations(x2, layer.input_scale if static else None)
        else:
            xq, x_scale = quantize_per_token(x2, FP8_DTYPE)  # one Triton pass on a GPU
        x_scale = x_scale.contiguous()  # _scaled_mm's row-wise scales: a real [M, 1] tensor
        out_dtype = torch.bfloat16 if x.is_cuda else x.dtype  # CUDA row-wise scaling emits bf16 only
        weight, weight_scale = layer.weight, layer.weight_scale
        if k % SCALED_MM_ALIGN or n % SCALED_MM_ALIGN:  # (CPU too, so CPU tests run this path)
            weight, weight_scale = _aligned_for_scaled_mm(layer)
            xq = torch.nn.functional.pad(xq, (0, weight.shape[1] - k))  # zero columns meet zero weight columns
        y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), out_dtype=out_dtype)
        y = y[:, :n].to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.reshape(*lead, -1)

    @classmethod
    def quantize(cls, weights, calibration=None, fp8_scale: str = "search"):
        scheme = "static" if calibration else "dynamic"
        return cls._quantize(weights, calibration, scheme, fp8_scale)
