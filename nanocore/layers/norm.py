"""RMSNorm, with the residual add fused in (the decoder's ``norm(x + residual)`` pattern)."""
from __future__ import annotations

import torch
from torch import nn

from nanocore.interfaces import set_weight_attrs
from nanocore.kernels.attention_dispatch import available as small_ops_available


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": default_weight_loader})

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``."""
        if x.is_cuda and small_ops_available():
            from nanocore.kernels.rmsnorm import rms_norm
            return rms_norm(x, self.weight, self.eps, residual)
        return rms_norm_reference(x, self.weight, self.eps, residual)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Torch twin of the Triton kernel (nanocore/kernels/rmsnorm.py); the residual sum is rounded first."""
    if residual is None:
        return _norm(x, weight, eps)
    x = x + residual
    return _norm(x, weight, eps), x


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # statistics in fp32 whatever the model dtype, as the reference implementations do
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
    """Replicated parameter: copy the whole checkpoint tensor after a shape check."""
    if param.shape != loaded_weight.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, the model expects "
                         f"{tuple(param.shape)}; does the checkpoint match its config.json?")
    param.data.copy_(loaded_weight)
