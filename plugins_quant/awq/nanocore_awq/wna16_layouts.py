"""The two checkpoint layouts ``wna16`` loads, and their common form after loading.

Each layout registers the checkpoint's own tensors (so merged q/k/v, gate/up and TP shards load through the
layer's loader) and ``canonical_tensors`` turns them into unsigned ``q [N, K]``, ``scales [N, G]``,
``zeros [N, G]`` and the act-order group index (None when groups are contiguous).
"""
from __future__ import annotations

import torch

from nanocore.toolkit.checkpoint import CheckpointFormatError, add_param, mark_loaded
from nanocore.toolkit.int_packing import pack_factor, unpack_int32


def _groups(method, k: int, input_size: int) -> tuple[int, int, dict]:
    """(groups on this rank, groups in the checkpoint, extra attrs): channel scales are one column, not split."""
    w = method.weights
    if w.strategy == "channel":
        return 1, 1, {}
    g = w.group_size
    if k % g or input_size % g:
        raise CheckpointFormatError(f"{method.name}: input size {k} (of {input_size}) is not a multiple of the "
                                    f"checkpoint's group size {g}; use a smaller tensor-parallel size")
    return k // g, input_size // g, {"input_dim": 1}


def _check_partitions(method, partitions: list[int], factor: int) -> None:
    if any(p % factor for p in partitions):
        raise CheckpointFormatError(f"{method.name}: output sizes {partitions} must be multiples of {factor} to hold "
                                    f"packed zero points; this layer cannot take this checkpoint")


def _g_idx_param(method, layer, name: str, k: int, partitions: list[int]) -> None:
    """Act-order group index, one row per merged shard (q, k and v may each have their own order)."""
    param = torch.nn.Parameter(torch.full((len(partitions), k), -1, dtype=torch.int32), requires_grad=False)

    def load(param, loaded, shard_id=None, *args):
        if loaded.numel() != k:
            raise CheckpointFormatError(f"{method.name}: '{name}' has {loaded.numel()} entries, the layer {k} inputs; "
                                        f"act-order checkpoints do not load with tensor parallelism yet")
        index = layer._shard_index(shard_id) if hasattr(layer, "_shard_index") else 0
        param.data[index].copy_(loaded.reshape(-1).to(torch.int32))
        mark_loaded(layer, name)
    param.weight_loader = load
    layer.register_parameter(name, param)


def compressed_tensors_params(method, layer, k: int, partitions: list[int], input_size: int,
                              weight_loader) -> list[str]:
    bits, n = method.weights.num_bits, sum(partitions)
    factor = pack_factor(bits)
    if k % factor:
        raise CheckpointFormatError(f"{method.name}: input size {k} is not a multiple of {factor} packed values")
    groups, full_groups, group_dim = _groups(method, k, input_size)
    add_param(layer, "weight_packed", (n, k // factor), torch.int32, weight_loader, method.name,
              full_input=input_size // factor, output_dim=0, input_dim=1, packed_dim=1, packed_factor=factor)
    add_param(layer, "weight_scale", (n, groups), torch.float32, weight_loader, method.name,
              full_input=full_groups if group_dim else None, output_dim=0, **group_dim)
    add_param(layer, "weight_shape", (2,), torch.int64, lambda param, loaded, *a: None, method.name)
    names = ["weight_packed", "weight_scale", "weight_shape"]
    if not method.weights.symmetric:
        _check_partitions(method, partitions, factor)
        add_param(layer, "weight_zero_point", (n // factor, groups), torch.int32, weight_loader, method.name,
                  full_input=full_groups if group_dim else None, output_dim=0, packed_dim=0, packed_factor=factor,
                  **group_dim)
        names.append("weight_zero_point")
    if method.actorder == "group":
        _g_idx_param(method, layer, "weight_g_idx", k, partitions)
        names.append("weight_g_idx")
    return names


def gptq_params(method, layer, k: int, partitions: list[int], input_size: int, weight_loader) -> list[str]:
    bits, n = method.weights.num_bits, sum(partitions)
    factor = pack_factor(bits)
    _check_partitions(method, partitions, factor)
    groups, full_groups, group_dim = _groups(method, k, input_size)
    rows = {"input_dim": 0} if group_dim else {}
    add_param(layer, "qweight", (k // factor, n), torch.int32, weight_loader, method.name,
              full_input=input_size // factor, input_dim=0, output_dim=1, packed_dim=0, packed_factor=factor)
    add_param(layer, "qzeros", (groups, n // factor), torch.int32, weight_loader, method.name,
              full_input=full_groups if group_dim else None, output_dim=1, packed_dim=1, packed_factor=factor, **rows)
    add_param(layer, "scales", (groups, n), torch.float32, weight_loader, method.name,
              full_input=full_groups if group_dim else None, output_dim=1, **rows)
    _g_idx_param(method, layer, "g_idx", k, partitions)
    return ["qweight", "qzeros", "scales", "g_idx"]


LAYOUTS = {"compressed-tensors": compressed_tensors_params, "gptq": gptq_params}


def gptq_v1_words_to_v2(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ v1 ``qzeros`` words -> v2 (the zero points themselves).

    v1 stores zero - 1. GPTQModel writes it by subtracting ``0x11111111`` (4-bit; ``0x01010101`` for 8-bit) from
    each whole packed int32 word and reads it back by adding the same constant to the word, so a zero point 0
    (asymmetric GPTQ gives it to a row-group with no negative weight) is stored as a borrow from the next value of
    the word, not as a lone 0xF. Adding per word, mod 2^32, inverts that exactly and equals adding 1 per value for
    every word without a borrow.
    """
    step = sum(1 << shift for shift in range(0, 32, bits))
    words = (qzeros.to(torch.int64) + step) & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def canonical_tensors(method, layer):
    """(unsigned q [N, K], scales [N, G], unsigned zeros [N, G], act-order g_idx [K] or per-shard [S, K] or None)."""
    bits, k = method.weights.num_bits, method.input_size
    mid = 1 << (bits - 1)
    if method.layout == "gptq":
        n = layer.qweight.shape[1]
        q = unpack_int32(layer.qweight.data, bits, k, dim=0).t()
        v2 = str(method.options.get("quantization_config", {}).get("checkpoint_format")) == "gptq_v2"
        qzeros = layer.qzeros.data if v2 else gptq_v1_words_to_v2(layer.qzeros.data, bits)
        zeros = unpack_int32(qzeros, bits, n, dim=1).t()
        scales, g_idx = layer.scales.data.t(), layer.g_idx.data
    else:
        n = layer.weight_packed.shape[0]
        q = unpack_int32(layer.weight_packed.data, bits, k, dim=1)
        scales = layer.weight_scale.data
        zeros = (unpack_int32(layer.weight_zero_point.data, bits, n, dim=0) if not method.weights.symmetric
                 else torch.full(scales.shape, mid, dtype=torch.int32, device=scales.device))
        g_idx = layer.weight_g_idx.data if method.actorder == "group" else None
    return q.contiguous(), scales.float().contiguous(), zeros.contiguous(), _simplify_g_idx(g_idx, k, scales.shape[1])


def _simplify_g_idx(g_idx: torch.Tensor | None, k: int, groups: int) -> torch.Tensor | None:
    """None for contiguous groups, one row if every shard agrees, else the per-shard rows."""
    if g_idx is None:
        return None
    if (g_idx < 0).any():
        raise CheckpointFormatError("the checkpoint's act-order group index (g_idx) is missing for some merged shard")
    contiguous = torch.arange(k, dtype=g_idx.dtype) * groups // k
    if bool((g_idx == contiguous).all()):
        return None
    return g_idx[0] if bool((g_idx == g_idx[0]).all()) else g_idx
