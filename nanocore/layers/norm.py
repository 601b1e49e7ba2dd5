"""RMSNorm, with the residual add fused in (the decoder's ``norm(x + residual)`` pattern)."""
from __future__ import annotations

import torch
from torch import nn

from nanocore.interfaces import set_weight_attrs


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": default_weight_loader})

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32 whatever the model dtype, as the reference implementations do
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
    """Replicated parameter: copy the whole checkpoint tensor after a shape check."""
    if param.shape != loaded_weight.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, the model expects "
                         f"{tuple(param.shape)}; does the checkpoint match its config.json?")
    param.data.copy_(loaded_weight)
