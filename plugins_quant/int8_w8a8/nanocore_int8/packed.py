"""compressed-tensors ``pack-quantized`` 8-bit weights for the int8 methods (llm-compressor W8A16, channel-wise).

The checkpoint holds ``weight_packed`` int32 ``[N, K / 4]`` (four values per word, value ``i`` at bits ``8 i``,
stored offset-binary: int8 + 128), ``weight_scale [N, 1]`` and ``weight_shape``. They load through the layer's
loaders as they are (merged q/k/v and gate/up shards, TP slices of whole words); after loading they become the
int8 ``weight [N, K]`` and ``weight_scale`` that an int-quantized checkpoint gives, so both formats run the same
kernels (the M <= 16 GEMV and the tiled GEMM of ``nanocore.toolkit.gemm``).
"""
from __future__ import annotations

import torch

from nanocore.toolkit.checkpoint import CheckpointFormatError, add_param, check_all_loaded
from nanocore.toolkit.checkpoint_formats import PACKED_FORMAT, parse_quantization_config
from nanocore.toolkit.int_packing import pack_factor, unpack_int8
from nanocore.toolkit.weights import ChannelScaledWeights, max_scale_loader

_FACTOR = pack_factor(8)


def is_packed(quantization_config: dict | None) -> bool:
    """True for a compressed-tensors pack-quantized config (the int8 methods' ``checkpoint_support`` vetted it)."""
    if not quantization_config:
        return False
    fmt = parse_quantization_config(quantization_config)
    return fmt is not None and bool(fmt.groups) and fmt.uniform_group().format == PACKED_FORMAT


def _ignore(param, loaded, *args, **kwargs) -> None:
    """``weight_shape``: the layer knows its shape; the tensor is read so the checkpoint loads whole."""


class PackedInt8Weights(ChannelScaledWeights):
    """``weight_packed`` / ``weight_scale`` / ``weight_shape`` in, int8 ``weight`` / ``weight_scale`` out."""

    def __init__(self, method: str, static_input_scale: bool):
        super().__init__(method, torch.int8, static_input_scale, per_tensor_scales=False)
        self.input_size = 0

    @property
    def names(self) -> list[str]:
        return ["weight_packed", "weight_scale", "weight_shape"] + (["input_scale"] if self.static_input_scale else [])

    def create(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
               input_size: int, weight_loader) -> None:
        k, n = input_size_per_partition, sum(output_partition_sizes)
        if k % _FACTOR:
            raise CheckpointFormatError(f"{self.method}: this rank's input size {k} is not a multiple of the "
                                        f"{_FACTOR} int8 values per packed word; use another tensor_parallel_size")
        self.partition_sizes, self.input_size = list(output_partition_sizes), k
        add_param(layer, "weight_packed", (n, k // _FACTOR), torch.int32, weight_loader, self.method,
                  full_input=-(-input_size // _FACTOR), output_dim=0, input_dim=1, packed_dim=1,
                  packed_factor=_FACTOR)
        add_param(layer, "weight_scale", (n, 1), torch.float32, weight_loader, self.method, output_dim=0)
        add_param(layer, "weight_shape", (2,), torch.int64, _ignore, self.method)
        if self.static_input_scale:
            add_param(layer, "input_scale", (1,), torch.float32, max_scale_loader, self.method, fill=0.0)

    def finish(self, layer: torch.nn.Module) -> None:
        check_all_loaded(layer, self.names, self.method)
        weight = unpack_int8(layer.weight_packed.data, self.input_size)
        del layer.weight_packed, layer.weight_shape
        layer.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))
