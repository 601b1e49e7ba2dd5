"""``int8_w8a8`` (int8 x int8 GEMM, ``torch._int_mm``) and ``int8_w8a16`` (int8 weights, Triton dequantizing GEMM).

Checkpoint format: compressed-tensors ``int-quantized``: ``<prefix>.weight`` int8 ``[N, K]``,
``<prefix>.weight_scale`` float ``[N, 1]`` (symmetric, per output channel), and for static activations
a scalar ``<prefix>.input_scale``; or ``pack-quantized`` with the same scales (llm-compressor's channel-wise
W8A16: ``weight_packed``, unpacked to int8 at load, ``nanocore_int8.packed``). ``input_activations`` in the
config decides dynamic per-token, static per-tensor, or none (weight-only).
"""
from __future__ import annotations

from typing import Any

import torch

from nanocore.interfaces import LinearMethod, QuantArgs, QuantScheme, check_options, choice_option
from nanocore.toolkit.act_quant import quantize_per_token
from nanocore.toolkit.capability import cuda_capability_reason, kernel_uses_triton
from nanocore.toolkit.checkpoint import CheckpointFormatError, quantize_checkpoint_linears
from nanocore.toolkit.checkpoint_support import int8_support
from nanocore.toolkit.gemm import (
    DECODE_MAX_M,
    gemm_input_rows,
    int8_scaled_linear,
    weight_only_linear,
    weight_only_linear_torch,
)
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, switch_points
from nanocore.toolkit.numerics import INT8_MAX, quantize_int8, quantize_int8_per_row
from nanocore.toolkit.weights import ChannelScaledWeights
from nanocore_int8.config import activation_scheme_of, compressed_tensors_config, is_weight_only
from nanocore_int8.packed import PackedInt8Weights, is_packed

_OPTIONS = {"activation_scheme": str, "kernel": str, "quantization_config": dict}
#: ``torch._int_mm`` on CUDA needs more than 16 rows; decode batches take the dequantizing GEMV instead.
_INT_MM_MIN_M = 17
#: Added to ``checkpoint_priority`` for the method whose activation scheme is the checkpoint's.
_SCHEME_MATCH_BONUS = 2


def _int_gemm(xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """int32 ``xq @ weight^T`` on ``torch._int_mm``; shapes it refuses go through an exact float GEMM."""
    n, k = weight.shape
    # cuBLASLt int8 needs K and N multiples of 8; torch 2.13's CPU _int_mm is wrong for K == 1
    if k == 1 or (xq.is_cuda and (k % 8 or n % 8)):
        return (xq.double() @ weight.double().t()).to(torch.int32)
    return torch._int_mm(xq, weight.t())


class _Int8Base(LinearMethod):
    api_version = "1.6"  # held to 1.6's rules: activations rounded as quant_scheme() declares
    quant_method = "compressed-tensors"
    default_scheme = "dynamic"

    @classmethod
    def checkpoint_support(cls, quantization_config):
        """compressed-tensors int-quantized or pack-quantized (llm-compressor W8A16 channel-wise): symmetric
        channel-wise int8 weights, activations none or int8."""
        return int8_support(cls.__name__, quantization_config, packed=True)

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        check_options(self.name, self.options, _OPTIONS)
        scheme = self.options.get("activation_scheme")
        if scheme is None:
            scheme = activation_scheme_of(self.options.get("quantization_config"), self.default_scheme)
        if scheme not in ("dynamic", "static", "none"):
            raise ValueError(f"{self.name}: activation_scheme must be 'dynamic', 'static' or 'none', got {scheme!r}")
        self.activation_scheme = scheme
        self.static_inputs = scheme == "static"  # a per-tensor input_scale from the checkpoint
        self.kernel = choice_option(self.name, self.options, "kernel", ("auto", "triton", "torch"))
        self.torch_only = self.kernel == "torch"

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        if device.type == "cpu":
            return None
        if device.type == "cuda":
            return cuda_capability_reason(device, (8, 0), f"{cls.name} (int8 tensor cores)")
        return f"{cls.name} runs on CPU or NVIDIA GPUs, not {device.type}"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        # per-channel int8 checkpoints only (compressed-tensors "channel" strategy): no per-tensor spreading
        if is_packed(self.options.get("quantization_config")):  # pack-quantized: unpacked to int8 after loading
            self.weights = PackedInt8Weights(self.name, self.static_inputs)
        else:
            self.weights = ChannelScaledWeights(self.name, torch.int8, self.static_inputs, per_tensor_scales=False)
        self.weights.create(layer, input_size_per_partition, output_partition_sizes, input_size, weight_loader)

    @classmethod
    def checkpoint_priority_for(cls, quantization_config: dict[str, Any] | None) -> int:
        """``auto``'s preference for this checkpoint: the method named for its activation scheme wins
        (int8_w8a16 for a weight-only config, int8_w8a8 otherwise)."""
        matches = is_weight_only(quantization_config) == (cls.default_scheme == "none")
        return cls.checkpoint_priority + (_SCHEME_MATCH_BONUS if matches else 0)

    def quant_scheme(self) -> QuantScheme:
        """int8 symmetric weights per output channel; int8 activations per token (dynamic), per tensor (static)
        or none (weight-only)."""
        activations = None
        if self.activation_scheme != "none":
            static = self.static_inputs
            activations = QuantArgs(8, "int", "tensor" if static else "token", dynamic=not static)
        return QuantScheme(weights=QuantArgs(8, "int", "channel"), input_activations=activations)

    def process_weights_after_loading(self, layer):
        self.weights.finish(layer)

    def _triton_usable(self, x: torch.Tensor) -> bool:
        return kernel_uses_triton(self.kernel, x.device, self.name)

    def _weight_only(self, layer, x, bias):
        if self._triton_usable(x):
            return weight_only_linear(x, layer.weight, layer.weight_scale, bias)
        return weight_only_linear_torch(x, layer.weight, layer.weight_scale, bias)

    @classmethod
    def _quantize(cls, weights, calibration, scheme: str):
        out = quantize_checkpoint_linears(cls.name, weights, calibration, scheme == "static", quantize_int8_per_row,
                                          INT8_MAX)
        return out, compressed_tensors_config(scheme)


class Int8W8A16LinearMethod(_Int8Base):
    """int8 weights per output channel; activations stay in the model dtype."""

    tolerance = (0.02, 0.02)  # int8 rounds to 1/254 of a row's range; measured worst 0.014 of max|y|
    # "auto" picks it for weight-only configs (checkpoint_priority_for); int8_w8a8 for the rest
    checkpoint_priority = 0
    default_scheme = "none"
    #: The kernel per M and the M values where it changes (``toolkit.kernel_plan``; tests run each side).
    kernel_plan = KERNEL_PLANS["int8_channel"]
    kernel_thresholds = switch_points(kernel_plan)

    def apply(self, layer, x, bias=None):
        return self._weight_only(layer, x, bias)

    @classmethod
    def quantize(cls, weights, calibration=None):
        return cls._quantize(weights, calibration, "none")


class Int8W8A8LinearMethod(_Int8Base):
    """int8 weights per channel, int8 activations (dynamic per token or static per tensor), int32 accumulate."""

    tolerance = (0.03, 0.03)  # weights and activations round to 1/254; measured worst 0.014
    checkpoint_priority = 1

    def apply(self, layer, x, bias=None):
        if self.activation_scheme == "none" or (x.is_cuda and x.numel() // x.shape[-1] < _INT_MM_MIN_M):
            return self._weight_only(layer, x, bias)  # decode is bandwidth-bound: read int8 weights once
        x2, lead = gemm_input_rows(x, layer.weight.shape[1], f"{self.name}'s layer")
        if self.static_inputs:
            x_scale = layer.input_scale.view(1, 1)
            xq = quantize_int8(x2, x_scale)
        else:  # kernel='torch': the Triton-free twin; else toolkit.act_quant's pick (one Triton pass on a GPU)
            xq, x_scale = quantize_int8_per_row(x2) if self.torch_only else quantize_per_token(x2, torch.int8)
        if self._triton_usable(x):  # int8 tensor cores with the scales and bias fused into the epilogue
            y = int8_scaled_linear(xq, x_scale, layer.weight, layer.weight_scale, bias, x.dtype)
        else:
            acc = _int_gemm(xq, layer.weight)
            y = (acc.float() * x_scale * layer.weight_scale.view(1, -1)).to(x.dtype)
            if bias is not None:
                y = y + bias
        return y.reshape(*lead, -1)

    @classmethod
    def quantize(cls, weights, calibration=None):
        return cls._quantize(weights, calibration, "static" if calibration else "dynamic")


__all__ = ["Int8W8A16LinearMethod", "Int8W8A8LinearMethod", "CheckpointFormatError", "DECODE_MAX_M"]
