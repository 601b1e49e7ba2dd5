"""Per-output-channel quantized weights as the fp8 / int8 / cutlass plugins load them: one set of loading rules.

``weight [N, K]`` (fp8 or int8) with a float32 ``weight_scale [N, 1]``, plus a scalar ``input_scale`` when
activations use a static scale. Checkpoints that store one scale per tensor fill that shard's rows (all rows when
the checkpoint holds the merged q/k/v or gate/up tensor itself); a merged layer missing some shard's scales is an
error. Static input scales of merged shards keep the largest, since the merged layer quantizes its one input once.
"""
from __future__ import annotations

import torch

from nanocore.toolkit.checkpoint import CheckpointFormatError, add_param, check_all_loaded, check_dtype, mark_loaded

_SHARD_INDEX = {"q": 0, "k": 1, "v": 2}


def max_scale_loader(param: torch.Tensor, loaded: torch.Tensor, *args, **kwargs) -> None:
    """Static input scales of merged shards: keep the largest (one scale per input)."""
    param.data.copy_(torch.maximum(param.data, loaded.float().reshape(-1)[:1]))


class ChannelScaledWeights:
    """Creates and finishes a layer's ``weight`` / ``weight_scale`` (/ ``input_scale``) for one method."""

    def __init__(self, method: str, weight_dtype: torch.dtype, static_input_scale: bool,
                 per_tensor_scales: bool = True):
        self.method, self.weight_dtype = method, weight_dtype
        self.static_input_scale = static_input_scale
        self.accepts_per_tensor = per_tensor_scales
        self.partition_sizes: list[int] = []
        self.scaled_shards: set[int | None] = set()  # merged shards whose scales were loaded (None: all at once)

    @property
    def names(self) -> list[str]:
        return ["weight", "weight_scale"] + (["input_scale"] if self.static_input_scale else [])

    def create(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
               input_size: int, weight_loader) -> None:
        n = sum(output_partition_sizes)
        self.partition_sizes = list(output_partition_sizes)
        add_param(layer, "weight", (n, input_size_per_partition), self.weight_dtype, weight_loader, self.method,
                  full_input=input_size, output_dim=0, input_dim=1)
        scale = add_param(layer, "weight_scale", (n, 1), torch.float32, weight_loader, self.method, output_dim=0)
        if self.accepts_per_tensor:
            scale.weight_loader = self._scale_loader(layer, scale.weight_loader)
        if self.static_input_scale:
            add_param(layer, "input_scale", (1,), torch.float32, max_scale_loader, self.method, fill=0.0)

    def _scale_loader(self, layer: torch.nn.Module, loader):
        def load(param, loaded, *args, **kwargs):
            check_dtype(loaded, param.dtype, "weight_scale", self.method)
            shard_id = args[0] if args else kwargs.get("shard_id", kwargs.get("loaded_shard_id"))
            self.scaled_shards.add(self._shard_index(layer, shard_id))
            if loaded.numel() == 1:  # one scale per tensor: the rows of its shard (all rows for a merged tensor)
                start, size = self._shard_rows(layer, shard_id)
                param.data[start:start + size].fill_(float(loaded))
                mark_loaded(layer, "weight_scale")
                return None
            return loader(param, loaded.reshape(-1, 1), *args, **kwargs)
        return load

    def _shard_index(self, layer: torch.nn.Module, shard_id) -> int | None:
        """Index of ``shard_id`` among the layer's merged outputs; None for a tensor that covers all of them."""
        if shard_id is None:
            return None
        if hasattr(layer, "_shard_index"):  # the parallel linears: their own ids ("q", 0, ...) and checks
            return layer._shard_index(shard_id)
        return _SHARD_INDEX.get(shard_id, shard_id)

    def _shard_rows(self, layer: torch.nn.Module, shard_id) -> tuple[int, int]:
        index = self._shard_index(layer, shard_id)
        if index is None:
            return 0, sum(self.partition_sizes)
        return sum(self.partition_sizes[:index]), self.partition_sizes[index]

    def finish(self, layer: torch.nn.Module) -> None:
        """After loading: every tensor present, and every merged shard given its scales."""
        check_all_loaded(layer, self.names, self.method)
        shards = self.scaled_shards
        if shards and None not in shards and len(shards) < len(self.partition_sizes):
            missing = sorted(set(range(len(self.partition_sizes))) - shards)
            raise CheckpointFormatError(
                f"{self.method}: the checkpoint has weight_scale for merged shards {sorted(shards)} of this layer "
                f"but not for {missing}; it is incomplete or was quantized with another method")
