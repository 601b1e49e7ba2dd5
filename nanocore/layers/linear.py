"""Tensor-parallel linear layers; storage and GEMM are delegated to a ``LinearMethod``.

Every layer owns one ``weight_loader(param, loaded_weight, shard_id=None)`` that is generic over the
parameter attributes a LinearMethod sets: ``output_dim`` / ``input_dim`` (which dimension a TP shard
narrows) and optional ``packed_factor`` / ``packed_dim`` (several logical values per stored element).
Merged layers (qkv, gate_up) place each checkpoint tensor at its offset along ``output_dim``.
A parameter with neither dim attribute (a per-tensor scale) is copied whole, or into its slot
when it holds one value per merged shard.
"""
from __future__ import annotations

import torch
from torch import nn

from nanocore.distributed import ParallelContext, divide, tp_all_reduce
from nanocore.interfaces import LinearMethod, set_weight_attrs


class LinearBase(nn.Module):
    """A linear layer whose output is made of named shards, each sharded (or not) over TP ranks.

    ``shard_ids[i]`` names the checkpoint tensor that fills output rows ``output_partition_sizes[i]``
    on this rank; ``shard_ranks[i]`` says which slice of that tensor this rank holds.
    """

    shards_output = False
    shards_input = False

    def __init__(self, input_size: int, output_size: int, *, input_size_per_partition: int,
                 output_partition_sizes: list[int], shard_ids: list, shard_ranks: list[int], bias: bool,
                 linear_method: LinearMethod, parallel: ParallelContext, params_dtype: torch.dtype,
                 prefix: str = ""):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = input_size_per_partition
        self.output_partition_sizes = list(output_partition_sizes)
        self.output_size_per_partition = sum(output_partition_sizes)
        self.shard_ids, self.shard_ranks = list(shard_ids), list(shard_ranks)
        self.parallel, self.params_dtype, self.prefix = parallel, params_dtype, prefix
        self.linear_method = linear_method
        linear_method.create_weights(self, input_size_per_partition, self.output_partition_sizes, input_size,
                                     output_size, params_dtype, weight_loader=self.weight_loader)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size_per_partition, dtype=params_dtype),
                                     requires_grad=False)
            set_weight_attrs(self.bias, {"weight_loader": self.weight_loader, "output_dim": 0})
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias)

    # ---- loading -------------------------------------------------------------------------
    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        output_dim = getattr(param, "output_dim", None)
        input_dim = getattr(param, "input_dim", None)
        if output_dim is None and input_dim is None:
            self._load_unsharded(param, loaded_weight, shard_id)
            return
        if shard_id is None and len(self.shard_ids) > 1 and output_dim is not None:
            self._load_fused(param, loaded_weight, output_dim)
            return
        dst = param.data
        if output_dim is not None:
            index = self._shard_index(shard_id)
            factor = _packing(param, output_dim)
            offset = sum(self.output_partition_sizes[:index]) // factor
            size = self.output_partition_sizes[index] // factor
            dst = dst.narrow(output_dim, offset, size)
            if self.shards_output:
                loaded_weight = _narrow(loaded_weight, output_dim, self.shard_ranks[index] * size, size)
        if input_dim is not None and self.shards_input:
            size = param.shape[input_dim]
            loaded_weight = _narrow(loaded_weight, input_dim, self.parallel.tp_rank * size, size)
        _copy(dst, loaded_weight)

    def _shard_index(self, shard_id) -> int:
        if shard_id is None and len(self.shard_ids) == 1:
            return 0
        if shard_id not in self.shard_ids:
            raise ValueError(f"{type(self).__name__} {self.prefix!r} has shards {self.shard_ids}, got {shard_id!r}")
        return self.shard_ids.index(shard_id)

    def _load_fused(self, param, loaded_weight, output_dim) -> None:
        """A checkpoint that already stores the merged tensor: split it and load each shard."""
        factor = _packing(param, output_dim)
        full_sizes = [self._full_shard_size(i) // factor for i in range(len(self.shard_ids))]
        if sum(full_sizes) != loaded_weight.shape[output_dim]:
            raise ValueError(f"fused tensor has {loaded_weight.shape[output_dim]} rows along dim {output_dim}, "
                             f"expected {sum(full_sizes)} for shards {self.shard_ids}")
        for shard_id, part in zip(self.shard_ids, loaded_weight.split(full_sizes, dim=output_dim)):
            self.weight_loader(param, part, shard_id)

    def _full_shard_size(self, index: int) -> int:
        """Rows of shard ``index`` in the full (unsharded) checkpoint tensor."""
        return self.output_partition_sizes[index]

    def _load_unsharded(self, param, loaded_weight, shard_id) -> None:
        per_shard = len(self.shard_ids) > 1 and param.dim() == 1 and param.numel() == len(self.shard_ids)
        if per_shard and shard_id is not None and loaded_weight.numel() == 1:
            param.data[self._shard_index(shard_id)].copy_(loaded_weight.reshape(()))
            return
        _copy(param.data, loaded_weight)


class ReplicatedLinear(LinearBase):
    """Full weight on every rank (small projections, routers)."""

    def __init__(self, input_size: int, output_size: int, *, bias: bool = False, linear_method: LinearMethod,
                 parallel: ParallelContext, params_dtype: torch.dtype, prefix: str = ""):
        super().__init__(input_size, output_size, input_size_per_partition=input_size,
                         output_partition_sizes=[output_size], shard_ids=[None], shard_ranks=[0], bias=bias,
                         linear_method=linear_method, parallel=parallel, params_dtype=params_dtype, prefix=prefix)


class ColumnParallelLinear(LinearBase):
    """Output features split over TP ranks; each rank returns its slice (no communication)."""

    shards_output = True

    def __init__(self, input_size: int, output_sizes: int | list[int], *, bias: bool = False,
                 linear_method: LinearMethod, parallel: ParallelContext, params_dtype: torch.dtype,
                 prefix: str = "", shard_ids: list | None = None):
        sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        tp = parallel.tp_size
        super().__init__(input_size, sum(sizes), input_size_per_partition=input_size,
                         output_partition_sizes=[divide(s, tp, f"{prefix} output size") for s in sizes],
                         shard_ids=shard_ids or ([None] if len(sizes) == 1 else list(range(len(sizes)))),
                         shard_ranks=[parallel.tp_rank] * len(sizes), bias=bias, linear_method=linear_method,
                         parallel=parallel, params_dtype=params_dtype, prefix=prefix)

    def _full_shard_size(self, index: int) -> int:
        return self.output_partition_sizes[index] * self.parallel.tp_size


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input in one GEMM (gate_up: shard ids 0 and 1)."""

    def __init__(self, input_size: int, output_sizes: list[int], **kwargs):
        super().__init__(input_size, list(output_sizes), **kwargs)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection, shard ids "q", "k", "v"; KV heads are replicated when tp_size > num_kv_heads."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, *, bias: bool = False,
                 linear_method: LinearMethod, parallel: ParallelContext, params_dtype: torch.dtype, prefix: str = ""):
        tp, rank = parallel.tp_size, parallel.tp_rank
        self.num_heads = divide(num_heads, tp, f"{prefix} num_attention_heads")
        if tp >= num_kv_heads:
            replicas = divide(tp, num_kv_heads, f"tensor_parallel_size over num_key_value_heads {num_kv_heads}:")
            self.num_kv_heads, kv_rank = 1, rank // replicas
        else:
            self.num_kv_heads, kv_rank = divide(num_kv_heads, tp, f"{prefix} num_key_value_heads"), rank
        self.head_dim = head_dim
        self.total_num_heads, self.total_num_kv_heads = num_heads, num_kv_heads
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        LinearBase.__init__(
            self, hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, input_size_per_partition=hidden_size,
            output_partition_sizes=[q_size, kv_size, kv_size], shard_ids=["q", "k", "v"],
            shard_ranks=[rank, kv_rank, kv_rank], bias=bias, linear_method=linear_method, parallel=parallel,
            params_dtype=params_dtype, prefix=prefix)

    def _full_shard_size(self, index: int) -> int:
        heads = self.total_num_heads if index == 0 else self.total_num_kv_heads
        return heads * self.head_dim


class RowParallelLinear(LinearBase):
    """Input features split over TP ranks; partial products are summed with an all-reduce."""

    shards_input = True

    def __init__(self, input_size: int, output_size: int, *, bias: bool = False, linear_method: LinearMethod,
                 parallel: ParallelContext, params_dtype: torch.dtype, prefix: str = ""):
        super().__init__(input_size, output_size,
                         input_size_per_partition=divide(input_size, parallel.tp_size, f"{prefix} input size"),
                         output_partition_sizes=[output_size], shard_ids=[None], shard_ranks=[0], bias=bias,
                         linear_method=linear_method, parallel=parallel, params_dtype=params_dtype, prefix=prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # bias after the reduce so it is added once, not tp_size times
        y = tp_all_reduce(self.linear_method.apply(self, x, None), self.parallel)
        return y if self.bias is None else y + self.bias


def _packing(param: torch.Tensor, dim: int) -> int:
    """How many logical values one stored element holds along ``dim``."""
    factor = getattr(param, "packed_factor", 1)
    return factor if getattr(param, "packed_dim", dim) == dim else 1


def _narrow(tensor: torch.Tensor, dim: int, start: int, size: int) -> torch.Tensor:
    if start + size > tensor.shape[dim]:
        raise ValueError(f"checkpoint tensor of shape {tuple(tensor.shape)} is too small along dim {dim} "
                         f"for rows {start}:{start + size}; does the checkpoint match the model config?")
    return tensor.narrow(dim, start, size)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(src.shape)}, the model expects {tuple(dst.shape)}; "
                         f"does the checkpoint match its config.json?")
    dst.copy_(src)
