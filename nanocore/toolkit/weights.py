"""Quantized weights as the fp8 / int8 / cutlass plugins load them: one set of loading rules.

``ChannelScaledWeights`` (per output channel) and ``BlockScaledWeights`` (one scale per 128 x 128 tile, see its
docstring). Per channel:
``weight [N, K]`` (fp8 or int8) with a float32 ``weight_scale [N, 1]``, plus a scalar ``input_scale`` when
activations use a static scale. Checkpoints that store one scale per tensor fill that shard's rows (all rows when
the checkpoint holds the merged q/k/v or gate/up tensor itself); a merged layer missing some shard's scales is an
error. Static input scales of merged shards keep the largest, since the merged layer quantizes its one input once.
"""
from __future__ import annotations

import torch

from nanocore.toolkit.checkpoint import CheckpointFormatError, add_param, check_all_loaded, check_dtype, mark_loaded
from nanocore.toolkit.numerics import expand_block_rows

_SHARD_INDEX = {"q": 0, "k": 1, "v": 2}


def max_scale_loader(param: torch.Tensor, loaded: torch.Tensor, *args, **kwargs) -> None:
    """Static input scales of merged shards: keep the largest (one scale per input)."""
    param.data.copy_(torch.maximum(param.data, loaded.float().reshape(-1)[:1]))


def _shard_id_of(args: tuple, kwargs: dict):
    """The shard id a weight loader was called with (positional, ``shard_id`` or ``loaded_shard_id``)."""
    return args[0] if args else kwargs.get("shard_id", kwargs.get("loaded_shard_id"))


def _layer_shard_index(layer: torch.nn.Module, shard_id) -> int | None:
    """Index of ``shard_id`` among the layer's merged outputs; None for a tensor that covers all of them."""
    if shard_id is None:
        return None
    if hasattr(layer, "_shard_index"):  # the parallel linears: their own ids ("q", 0, ...) and checks
        return layer._shard_index(shard_id)
    return _SHARD_INDEX.get(shard_id, shard_id)


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
            shard_id = _shard_id_of(args, kwargs)
            self.scaled_shards.add(_layer_shard_index(layer, shard_id))
            if loaded.numel() == 1:  # one scale per tensor: the rows of its shard (all rows for a merged tensor)
                start, size = self._shard_rows(layer, shard_id)
                param.data[start:start + size].fill_(float(loaded))
                mark_loaded(layer, "weight_scale")
                return None
            return loader(param, loaded.reshape(-1, 1), *args, **kwargs)
        return load

    def _shard_rows(self, layer: torch.nn.Module, shard_id) -> tuple[int, int]:
        index = _layer_shard_index(layer, shard_id)
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


class BlockScaledWeights:
    """A layer's one-byte ``weight [N, K]`` with one scale per ``block = (rows, cols)`` tile (DeepSeek-V3 /
    llm-compressor ``FP8_BLOCK``; checkpoint ``<scale_name> [ceil(N/rows), ceil(K/cols)]``), loaded merged / sharded.

    The layer keeps the checkpoint's tiles (``layout == block``) when every merged shard and TP slice starts on a
    tile row (a layer of one shard whose output is not split always does: o_proj / down_proj of any size); otherwise
    (SmolLM2's q/k/v: 576 / 192 / 192 rows) each tile row is repeated per weight row at load (``layout == (1, cols)``:
    4 bytes per row and K tile, 1/32 of the fp8 weight for 128 columns). Either way
    ``nanocore.toolkit.gemm_block.block_scaled_linear(x, weight, scale, layout)`` computes the layer.
    """

    def __init__(self, method: str, weight_dtype: torch.dtype, block: tuple[int, int],
                 scale_name: str = "weight_scale", static_input_scale: bool = False):
        self.method, self.weight_dtype = method, weight_dtype
        self.block = (int(block[0]), int(block[1]))
        self.scale_name, self.static_input_scale = scale_name, static_input_scale
        self.layout = self.block
        self.partition_sizes: list[int] = []

    @property
    def names(self) -> list[str]:
        return ["weight", self.scale_name] + (["input_scale"] if self.static_input_scale else [])

    def create(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
               input_size: int, weight_loader, output_size: int | None = None) -> None:
        """``output_size``: the layer's full output (before TP); given, a one-shard layer that equals it keeps tiles."""
        rows, cols = self.block
        if input_size_per_partition != input_size and input_size_per_partition % cols:
            raise CheckpointFormatError(
                f"{self.method}: this rank's {input_size_per_partition} of {input_size} input features do not start "
                f"on a {cols}-column scale block; use a tensor_parallel_size that splits the input into multiples "
                f"of {cols}")
        n = sum(output_partition_sizes)
        self.partition_sizes = list(output_partition_sizes)
        add_param(layer, "weight", (n, input_size_per_partition), self.weight_dtype, weight_loader, self.method,
                  full_input=input_size, output_dim=0, input_dim=1)
        k_tiles, full_k_tiles = -(-input_size_per_partition // cols), -(-input_size // cols)
        if all(size % rows == 0 for size in output_partition_sizes):  # merged / TP placement in whole tiles
            self.layout = self.block
            add_param(layer, self.scale_name, (n // rows, k_tiles), torch.float32, weight_loader, self.method,
                      full_input=full_k_tiles, output_dim=0, input_dim=1, packed_dim=0, packed_factor=rows)
        elif len(output_partition_sizes) == 1 and output_size == n:  # the whole output: the checkpoint's tiles as-is
            self.layout = self.block
            add_param(layer, self.scale_name, (-(-n // rows), k_tiles), torch.float32, weight_loader, self.method,
                      full_input=full_k_tiles, input_dim=1)
        else:
            self.layout = (1, cols)
            add_param(layer, self.scale_name, (n, k_tiles), torch.float32, self._row_loader(layer, weight_loader),
                      self.method, full_input=full_k_tiles, output_dim=0, input_dim=1)
        if self.static_input_scale:  # loaded so the checkpoint is read whole; a weight-only method does not use it
            add_param(layer, "input_scale", (1,), torch.float32, max_scale_loader, self.method, fill=0.0)

    def _row_loader(self, layer: torch.nn.Module, loader):
        """Tile rows -> one scale row per weight row of the loaded tensor, then the layer's own placement."""

        def load(param, loaded, *args, **kwargs):
            shard_id = _shard_id_of(args, kwargs)
            rows = self._full_rows(layer, shard_id)
            return loader(param, expand_block_rows(loaded.float(), rows, self.block[0]), *args, **kwargs)
        return load

    def _full_rows(self, layer: torch.nn.Module, shard_id) -> int:
        """Rows of the checkpoint tensor loaded for ``shard_id`` (all shards of a merged layer for None)."""
        sizes = self.partition_sizes
        full = getattr(layer, "_full_shard_size", lambda i: sizes[i])  # parallel linears know TP / replicated kv
        if shard_id is None:
            return sum(full(i) for i in range(len(sizes)))
        return full(_layer_shard_index(layer, shard_id))

    def scale(self, layer: torch.nn.Module) -> torch.Tensor:
        return getattr(layer, self.scale_name)

    def finish(self, layer: torch.nn.Module) -> None:
        check_all_loaded(layer, self.names, self.method)
