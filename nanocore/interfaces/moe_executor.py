"""MoEExecutor: the expert computation of a MoE layer.

The router and prepare/finalize (local, or expert-parallel all-to-all) stay in the core; the
executor sees routed tokens and this rank's stacked expert weights.

Constructor: ``__init__(self, options: dict | None = None)`` with the user's ``moe_executor_options``; one
instance serves every MoE layer. ``apply`` runs on every forward of every MoE layer with any number of tokens,
from 1 (decode) to a whole prefill chunk; many experts may get no token, and with expert parallelism
``topk_ids`` outside ``[0, E)`` mark experts of other ranks (they contribute nothing). If
``supports_cuda_graph`` is True, ``apply`` is captured in decode CUDA graphs: no host synchronisation, no
data-dependent shapes or allocations. The conformance suite compares with the ``eager`` oracle on batch sizes
that cross any size threshold an executor may switch strategies at.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from nanocore.interfaces.base import Backend


class MoEExecutor(Backend):
    #: Whether ``apply`` can be captured in a CUDA graph (no host synchronisation).
    supports_cuda_graph: ClassVar[bool] = False
    #: (atol, rtol) against the ``eager`` oracle.
    tolerance: ClassVar[tuple[float, float]] = (1e-5, 1e-5)
    #: Activations the executor implements.
    activations: ClassVar[tuple[str, ...]] = ("silu",)

    @abstractmethod
    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        activation: str = "silu",
    ) -> torch.Tensor:
        """``x[M,H]``, ``topk_weights[M,K]``, ``topk_ids[M,K]`` (ids < 0 or >= E contribute nothing),
        ``w13[E,2I,H]`` (gate rows then up rows), ``w2[E,H,I]`` -> ``[M,H]`` in ``x.dtype``:
        ``sum_k topk_weights[m,k] * w2[e] @ (act(w13[e,:I] @ x) * (w13[e,I:] @ x))``."""


def check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, activations) -> None:
    """Clear errors for malformed MoE inputs, shared by every executor."""
    if x.dim() != 2:
        raise ValueError(f"MoE input must be [num_tokens, hidden], got shape {tuple(x.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be "
            f"[num_tokens={x.shape[0]}, top_k]"
        )
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[0] != w2.shape[0]:
        raise ValueError(f"expert weights must be w13[E,2I,H] and w2[E,H,I], got {tuple(w13.shape)} and {tuple(w2.shape)}")
    num_experts, two_i, hidden = w13.shape
    if hidden != x.shape[1] or w2.shape[1] != hidden or w2.shape[2] * 2 != two_i:
        raise ValueError(
            f"shape mismatch: x hidden {x.shape[1]}, w13 {tuple(w13.shape)} (expects [E,2I,H]), w2 {tuple(w2.shape)} (expects [E,H,I])"
        )
    if activation not in activations:
        raise ValueError(f"activation {activation!r} is not supported; supported: {list(activations)}")
