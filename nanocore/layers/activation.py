"""Gated activations of the MLP: the input holds [gate | up] from one merged GEMM."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanocore.kernels.attention_dispatch import available as small_ops_available


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` for ``x = [gate | up]`` along the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and small_ops_available():
            from nanocore.kernels.activation import silu_and_mul
            return silu_and_mul(x)
        return silu_and_mul_reference(x)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """Torch twin of the Triton kernel (nanocore/kernels/activation.py)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


ACTIVATIONS = {"silu": SiluAndMul}


def get_gated_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()
