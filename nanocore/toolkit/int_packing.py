"""Packed int weights as compressed-tensors (pack-quantized) and GPTQ store them: pack, unpack, dequantize.

compressed-tensors packs ``32 / bits`` values per int32 densely, value ``i`` of a word at bits ``i * bits``
(little-endian), after adding ``2^(bits-1)`` to the signed value; weights are packed along the input dim (dim 1),
zero points along the output dim (dim 0). GPTQ packs unsigned values the same way along dim 0 of ``[K, N]``.
"""
from __future__ import annotations

import torch

PACKED_BITS = (4, 8)


def pack_factor(num_bits: int) -> int:
    if num_bits not in PACKED_BITS:
        raise ValueError(f"packed int weights must have 4 or 8 bits, got {num_bits}")
    return 32 // num_bits


def pack_int32(values: torch.Tensor, num_bits: int, dim: int) -> torch.Tensor:
    """Unsigned values (0 .. 2^bits - 1) of a 2-D tensor -> int32 words along ``dim`` (zero-padded to a word)."""
    factor = pack_factor(num_bits)
    v = values.to(torch.int64).transpose(0, 1) if dim == 0 else values.to(torch.int64)
    rows, cols = v.shape
    v = torch.nn.functional.pad(v, (0, -cols % factor)).reshape(rows, -1, factor)
    shifts = torch.arange(0, 32, num_bits, dtype=torch.int64, device=v.device)
    words = (v << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # two's complement int32
    return (words.transpose(0, 1) if dim == 0 else words).contiguous()


def unpack_int32(packed: torch.Tensor, num_bits: int, size: int, dim: int) -> torch.Tensor:
    """Inverse of :func:`pack_int32`: int32 words -> unsigned int32 values, ``size`` of them along ``dim``."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed int weights must be int32, got {packed.dtype}")
    pack_factor(num_bits)  # 4 or 8 bits, else a clear error
    words = packed.transpose(0, 1) if dim == 0 else packed
    shifts = torch.arange(0, 32, num_bits, dtype=torch.int32, device=packed.device)
    values = ((words.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)).reshape(words.shape[0], -1)
    if values.shape[1] < size:
        raise ValueError(f"packed tensor of shape {tuple(packed.shape)} holds {values.shape[1]} values along dim "
                         f"{dim}, fewer than {size}; the checkpoint does not match the layer")
    values = values[:, :size]
    return (values.transpose(0, 1) if dim == 0 else values).contiguous()


def unpack_int8(packed: torch.Tensor, size: int, rows_per_chunk: int = 4096) -> torch.Tensor:
    """compressed-tensors pack-quantized 8-bit weights, int32 ``[N, ceil(K / 4)]`` -> signed int8 ``[N, K]``.

    The words hold the values offset-binary (stored = value + 128, see the module docstring), so 0 .. 255 maps back
    to -128 .. 127; rows go in chunks so the int32 temporaries of a large layer stay small."""
    out = torch.empty(packed.shape[0], size, dtype=torch.int8, device=packed.device)
    for start in range(0, packed.shape[0], rows_per_chunk):
        rows = packed[start:start + rows_per_chunk]
        out[start:start + rows_per_chunk] = (unpack_int32(rows, 8, size, dim=1) - 128).to(torch.int8)
    return out


def group_index(input_size: int, num_groups: int, g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Group of each input channel: ``g_idx`` (act-order checkpoints) or contiguous groups."""
    if g_idx is not None:
        return g_idx.long()
    return torch.arange(input_size, device="cpu") * num_groups // input_size


def dequantize_int(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None = None,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``W [N, K] = (q - zeros[:, g]) * scales[:, g]`` with unsigned ``q [N, K]`` and per-group ``[N, G]``."""
    groups = group_index(q.shape[1], scales.shape[1], g_idx).to(q.device)
    return ((q.float() - zeros.float()[:, groups]) * scales.float()[:, groups]).to(dtype)


def quantize_int_groups(w: torch.Tensor, num_bits: int, group_size: int, symmetric: bool):
    """Round-to-nearest ``w [N, K]``: unsigned ``q [N, K]``, ``scales [N, G]``, unsigned ``zeros [N, G]``."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"input size {k} is not a multiple of the group size {group_size}; pass another group size "
                         f"or add the layer to the ignore list")
    qmax, mid = (1 << num_bits) - 1, 1 << (num_bits - 1)
    g = w.float().reshape(n, k // group_size, group_size)
    if symmetric:
        # compressed-tensors' rule: absmax / (range / 2), values clamped to [-2^(b-1), 2^(b-1) - 1]
        scales = (g.abs().amax(dim=-1, keepdim=True) / (qmax / 2)).clamp_min(1e-12)
        zeros = torch.full_like(scales, float(mid))
    else:
        lo, hi = g.amin(dim=-1, keepdim=True).clamp_max(0), g.amax(dim=-1, keepdim=True).clamp_min(0)
        scales = ((hi - lo) / qmax).clamp_min(1e-12)
        zeros = (-lo / scales).round().clamp(0, qmax)
    q = (g / scales).round().add(zeros).clamp(0, qmax).to(torch.int32).reshape(n, k)
    return q, scales.squeeze(-1), zeros.squeeze(-1).to(torch.int32)


def pack_quantized_tensors(w: torch.Tensor, num_bits: int, group_size: int, symmetric: bool) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized tensors of one linear (as llm-compressor writes W4A16 / W8A16); scales in
    the weight's dtype, as llm-compressor keeps them (readers dequantize in the scale dtype)."""
    q, scales, zeros = quantize_int_groups(w, num_bits, group_size, symmetric)
    out = {"weight_packed": pack_int32(q, num_bits, dim=1), "weight_scale": scales.to(w.dtype),
           "weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}
    if not symmetric:
        out["weight_zero_point"] = pack_int32(zeros, num_bits, dim=0)
    return out
