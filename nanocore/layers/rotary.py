"""Rotary position embedding (rotate-half / NeoX layout), with the ``llama3`` and ``linear`` scalings.

The cos/sin table is computed once per model in fp32 and indexed by position.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from nanocore.kernels.attention_dispatch import available as small_ops_available

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(hf_config) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling dict or {}) from a HF config of transformers 4.x or 5.x."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    theta = params.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0
    return float(theta), params


def base_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by ``factor``, short kept, a smooth ramp in between."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    ramp = ((original_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    # ramp 0 = low frequency (fully scaled), 1 = high frequency (unchanged)
    scaled = (1 - ramp) * inv_freq / factor + ramp * inv_freq
    is_low = wavelen > original_len / low
    is_high = wavelen < original_len / high
    return torch.where(is_low, inv_freq / factor, torch.where(is_high, inv_freq, scaled))


def scaled_inv_freq(rotary_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    inv_freq = base_inv_freq(rotary_dim, theta)
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        missing = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} - set(scaling)
        if missing:
            raise ValueError(f"rope_scaling type 'llama3' needs {sorted(missing)} in config.json")
        return llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported; supported types: "
                     f"{list(SUPPORTED_ROPE_TYPES)} (edit rope_scaling in config.json or add the type to "
                     f"nanocore/layers/rotary.py)")


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of each head of q and k by position."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict[str, Any] | None = None,
                 rotary_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        inv_freq = scaled_inv_freq(self.rotary_dim, theta, scaling or {}).to(torch.get_default_device())
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32, device=inv_freq.device), inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_norm: nn.Module | None = None,
                k_norm: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``q[T, Hq*D]``, ``k[T, Hkv*D]`` (or already ``[T, H, D]``) -> rotated, same shapes. ``q_norm`` /
        ``k_norm`` (RMSNorm modules over each head, Qwen3) are applied first when given.

        On CUDA the Triton kernel normalizes and rotates q and k in place (one launch) and returns them.
        """
        if (q_norm is None) != (k_norm is None):
            raise ValueError("RotaryEmbedding: q_norm and k_norm go together (give both or neither)")
        fused = None if q_norm is None else ((q_norm.weight, q_norm.eps), (k_norm.weight, k_norm.eps))
        if q.is_cuda and small_ops_available():
            from nanocore.kernels.rotary import can_fuse_qk_norm, can_rotate_in_place, rotary_embedding
            if fused is not None and not (can_rotate_in_place(q, k, self.head_dim)
                                          and can_fuse_qk_norm(q, self.head_dim, self.rotary_dim, fused)):
                q, k, fused = *self._normalize_heads(q, k, q_norm, k_norm), None  # then the plain rotation kernel
            if can_rotate_in_place(q, k, self.head_dim):
                return rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, self.rotary_dim, fused)
        if fused is not None:
            q, k = self._normalize_heads(q, k, q_norm, k_norm)
        return rotary_reference(positions, q, k, self.cos_sin_cache, self.head_dim, self.rotary_dim)

    def _normalize_heads(self, q, k, q_norm: nn.Module, k_norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """The norms as separate ops (new tensors, same shapes as given)."""
        return tuple(norm(x.reshape(x.shape[0], -1, self.head_dim)).reshape(x.shape)
                     for x, norm in ((q, q_norm), (k, k_norm)))


def rotary_reference(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                     head_dim: int, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of the Triton kernel (nanocore/kernels/rotary.py); returns new tensors."""
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
    cos_q, sin_q = cos.to(q.dtype), sin.to(q.dtype)  # gathered and cast once for q and k
    cos_k, sin_k = (cos_q, sin_q) if k.dtype == q.dtype else (cos.to(k.dtype), sin.to(k.dtype))
    return _rotate(q, cos_q, sin_q, head_dim, rotary_dim), _rotate(k, cos_k, sin_k, head_dim, rotary_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int) -> torch.Tensor:
    shape = x.shape
    x = x.view(shape[0], -1, head_dim)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = rot.chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([rotated, rest], dim=-1).view(shape) if rest.numel() else rotated.view(shape)


def build_rope(hf_config, head_dim: int) -> RotaryEmbedding:
    theta, scaling = rope_parameters(hf_config)
    return RotaryEmbedding(head_dim, hf_config.max_position_embeddings, theta, scaling)
