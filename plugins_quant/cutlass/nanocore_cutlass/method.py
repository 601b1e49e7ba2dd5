"""``cutlass``: FP8 W8A8 linear on a CUTLASS 3.x sm_90a kernel (per-token x per-channel scales in the epilogue).

Loads the checkpoints ``fp8_w8a8`` loads (``quantization_config = {"quant_method": "fp8", "activation_scheme":
"dynamic" | "static"}``): ``<prefix>.weight`` fp8 e4m3 ``[N, K]``, ``<prefix>.weight_scale`` float ``[N, 1]``
or a per-tensor scalar (spread over its merged shard), and with static activations a scalar
``<prefix>.input_scale`` (the largest over merged shards). On CUDA the GEMM is the compiled CUTLASS kernel,
never anything else; on CPU the method runs its torch twin (``nanocore_cutlass.twin``).
"""
from __future__ import annotations

from typing import Any

import torch

from nanocore.interfaces import LinearMethod, QuantArgs, QuantScheme, check_options, choice_option
from nanocore.toolkit.checkpoint import fp8_activation_scheme, quantize_checkpoint_linears
from nanocore.toolkit.checkpoint_support import fp8_checkpoint_config, fp8_support
from nanocore.toolkit.gemm import gemm_input_rows
from nanocore.toolkit.numerics import FP8_DTYPE, FP8_MAX, quantize_fp8_per_row
from nanocore.toolkit.weights import ChannelScaledWeights
from nanocore_cutlass import build
from nanocore_cutlass.twin import fp8_linear_twin

_OPTIONS = {"kernel": str, "activation_scheme": str, "quantization_config": dict}
#: TMA needs 16-byte aligned rows: K % 16 for fp8 operands, N % 8 for the 16-bit output; weights are padded once.
K_ALIGN, N_ALIGN = 16, 8
_WHAT = "cutlass (CUTLASS sm_90a FP8 kernel)"


class CutlassFp8LinearMethod(LinearMethod):
    """fp8 e4m3 weights per output channel x fp8 activations (dynamic per token or static per tensor)."""

    api_version = "1.6"  # held to 1.6's rules: activations rounded as quant_scheme() declares
    quant_method = "fp8"  # the checkpoints fp8_w8a8 loads
    tolerance = (0.07, 0.07)  # as fp8_w8a8: weights and activations each round to 1/16 of their scale
    checkpoint_priority = -1  # loads fp8 checkpoints when named; "auto" keeps fp8_w8a16 / fp8_w8a8

    @classmethod
    def checkpoint_support(cls, quantization_config):
        """fp8 and compressed-tensors float-quantized checkpoints (per-channel / per-tensor scales)."""
        return fp8_support(cls.__name__, quantization_config)

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        check_options(self.name, self.options, _OPTIONS)
        self.kernel = choice_option(self.name, self.options, "kernel", ("auto", "cutlass", "torch"))
        self.activation_scheme = fp8_activation_scheme(self.name, self.options)
        self.static_inputs = self.activation_scheme == "static"  # a per-tensor input_scale from the checkpoint
        self._extension = None

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        if device.type == "cpu":
            return None  # the torch twin: same quantization and scale order, float GEMM
        if device.type != "cuda":
            return f"{_WHAT} runs on NVIDIA GPUs (or its torch twin on CPU), not {device.type}"
        if not torch.cuda.is_available():
            return f"{_WHAT} needs CUDA, which is not available in this torch build or machine"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) != (9, 0):
            return (f"{_WHAT} is built for sm_90a (Hopper: H100/H200) only, this GPU has capability {major}.{minor}; "
                    f"use linear_method='fp8_w8a8' (torch._scaled_mm) or 'fp8_w8a16'")
        return build.toolchain_reason() or build.cached_failure()

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        self.input_size = input_size_per_partition
        self.output_size = sum(output_partition_sizes)
        self.weights = ChannelScaledWeights(self.name, FP8_DTYPE, self.static_inputs)
        self.weights.create(layer, input_size_per_partition, output_partition_sizes, input_size, weight_loader)

    def quant_scheme(self) -> QuantScheme:
        """fp8 e4m3 weights per output channel; fp8 activations per token (dynamic) or per tensor (static)."""
        static = self.static_inputs
        activations = QuantArgs(8, "float", "tensor" if static else "token", dynamic=not static)
        return QuantScheme(weights=QuantArgs(8, "float", "channel"), input_activations=activations)

    def process_weights_after_loading(self, layer):
        self.weights.finish(layer)
        if self._uses_cutlass(layer.weight.device):
            self._prepare_cutlass(layer)  # compile now, never inside a forward or a CUDA-graph capture

    def _prepare_cutlass(self, layer):
        self._extension = build.load_extension()
        _pad_for_tma(layer)

    def _uses_cutlass(self, device: torch.device) -> bool:
        if self.kernel == "torch" or (device.type == "cpu" and self.kernel == "auto"):
            return False
        reason = self.supports(device) if device.type == "cuda" else f"kernel='cutlass' needs an sm_90 GPU, not {device}"
        if reason:
            raise RuntimeError(f"{self.name}: {reason}" + ("; kernel='torch' runs the twin (slow, for checking)"
                                                           if device.type == "cuda" else ""))
        return True

    def apply(self, layer, x, bias=None):
        x2, lead = gemm_input_rows(x, self.input_size, f"{self.name} layer")
        input_scale = layer.input_scale if self.static_inputs else None
        if self._runs_cutlass(x):
            y = self._cutlass_gemm(layer, x2, input_scale)
        else:
            weight = layer.weight[: self.output_size, : self.input_size]
            y = fp8_linear_twin(x2, weight, layer.weight_scale[: self.output_size], input_scale)
        if bias is not None:
            y = y + bias
        return y.reshape(*lead, self.output_size)

    def _runs_cutlass(self, x: torch.Tensor) -> bool:
        return x.is_cuda and self.kernel != "torch"

    def _cutlass_gemm(self, layer, x2, input_scale):
        if self._extension is None:  # weights moved to the GPU after loading
            if not layer.weight.is_cuda:
                raise RuntimeError(f"{self.name}: input on {x2.device} but the layer's weights are on "
                                   f"{layer.weight.device}; move the model to the GPU first")
            self._uses_cutlass(x2.device)
            self._prepare_cutlass(layer)
        xq, x_scale = self._extension.quantize_fp8_rows(x2, layer.weight.shape[1], input_scale)
        out_dtype = x2.dtype if x2.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        y = self._extension.fp8_scaled_mm(xq, layer.weight, x_scale.view(-1), layer.weight_scale.view(-1), out_dtype)
        return y[:, : self.output_size].to(x2.dtype)

    @classmethod
    def quantize(cls, weights, calibration=None, **options):
        """Plain absmax fp8 checkpoints; ``nanocore quantize --method fp8_w8a8`` writes the same format with its
        scale search, and ``cutlass`` loads those too."""
        if options:
            raise ValueError(f"{cls.name} quantize takes no options (got {sorted(options)}); for fp8 scale search make "
                             f"the checkpoint with --method fp8_w8a8 (same format) and load it with 'cutlass'")
        out = quantize_checkpoint_linears(cls.name, weights, calibration, bool(calibration), quantize_fp8_per_row,
                                          FP8_MAX)
        return out, fp8_checkpoint_config("static" if calibration else "dynamic")


def _pad_for_tma(layer: torch.nn.Module) -> None:
    """Zero-pad ``weight`` to K % 16 and N % 8 (and ``weight_scale`` rows to match); the output is sliced back."""
    n, k = layer.weight.shape
    pad_n, pad_k = -n % N_ALIGN, -k % K_ALIGN
    if pad_n or pad_k:
        weight = torch.zeros(n + pad_n, k + pad_k, dtype=layer.weight.dtype, device=layer.weight.device)
        weight[:n, :k] = layer.weight.data
        layer.weight.data = weight
        scale = torch.ones(n + pad_n, 1, dtype=torch.float32, device=layer.weight.device)
        scale[:n] = layer.weight_scale.data
        layer.weight_scale.data = scale
    layer.weight_scale.data = layer.weight_scale.data.float().contiguous()
