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

Expert weight formats (API 1.2): ``weight_formats`` lists the formats ``apply`` takes; the core holds a layer's
experts in one of them and passes only what the executor declares (and ``supports_weight_format`` accepts on the
device), else it dequantizes to the model dtype at load, as for a 1.0 / 1.1 executor.

- ``"float"`` (every executor): ``w13`` / ``w2`` in the model dtype; ``w13_scale`` and ``w2_scale`` are not passed.
- ``"fp8_channel"``: ``w13[E,2I,H]`` and ``w2[E,H,I]`` in ``torch.float8_e4m3fn`` with float32 per-output-channel
  scales ``w13_scale[E,2I]`` (gate rows then up rows, each row its own scale) and ``w2_scale[E,H]``, passed as the
  keyword arguments ``w13_scale=`` / ``w2_scale=``. The dequantized weights are ``w13.float() * w13_scale[..., None]``
  and ``w2.float() * w2_scale[..., None]``; the result equals the float formula of ``apply`` on them (in
  ``x.dtype``) within the executor's ``tolerance``. The conformance suite checks it against ``eager`` on the
  dequantized weights.

``conformance_requirements`` an executor may declare (a class attribute dict, applied by every conformance class):
``{"hidden_multiple": 64, "intermediate_multiple": 64}``, multiples its kernels need of H and I (default 8 each), and
``"token_thresholds": (64, 256)``, the token counts at which it switches strategies (each side of each is tested;
since 1.5).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from nanocore.interfaces.base import Backend

#: Expert weight formats the core knows (see the module doc).
WEIGHT_FORMATS: tuple[str, ...] = ("float", "fp8_channel")
#: Storage dtype of ``fp8_channel`` expert weights.
FP8_EXPERT_DTYPE = torch.float8_e4m3fn


class MoEExecutor(Backend):
    #: Whether ``apply`` can be captured in a CUDA graph (no host synchronisation).
    supports_cuda_graph: ClassVar[bool] = False
    #: (atol, rtol) against the ``eager`` oracle.
    tolerance: ClassVar[tuple[float, float]] = (1e-5, 1e-5)
    #: Activations the executor implements.
    activations: ClassVar[tuple[str, ...]] = ("silu",)
    #: Expert weight formats ``apply`` takes (API 1.2; see the module doc). ``"float"`` is always taken.
    weight_formats: ClassVar[tuple[str, ...]] = ("float",)

    def supports_weight_format(self, weight_format: str, device: torch.device) -> str | None:
        """None if ``apply`` on ``device`` takes experts in ``weight_format``, else why not. Override to add a
        device requirement (e.g. a CUDA capability for fp8 loads); the default checks ``weight_formats``."""
        if weight_format not in WEIGHT_FORMATS:
            return f"unknown expert weight format {weight_format!r}; nanocore knows {list(WEIGHT_FORMATS)}"
        if weight_format != "float" and weight_format not in self.weight_formats:
            return (f"{type(self).__name__} takes expert weight formats {list(self.weight_formats)}, "
                    f"not {weight_format!r}")
        return None

    @abstractmethod
    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        activation: str = "silu",
        *,
        w13_scale: torch.Tensor | None = None,
        w2_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x[M,H]``, ``topk_weights[M,K]``, ``topk_ids[M,K]`` (ids < 0 or >= E contribute nothing),
        ``w13[E,2I,H]`` (gate rows then up rows), ``w2[E,H,I]`` -> ``[M,H]`` in ``x.dtype``:
        ``sum_k topk_weights[m,k] * w2[e] @ (act(w13[e,:I] @ x) * (w13[e,I:] @ x))``.

        ``w13_scale[E,2I]`` / ``w2_scale[E,H]`` (float32) come only with ``"fp8_channel"`` weights, and only to an
        executor that declares that format: the formula then runs on the dequantized weights (module doc). An
        executor written for API 1.0 / 1.1 may leave them out of its signature."""


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


def moe_weight_format(w13, w2, w13_scale=None, w2_scale=None) -> str:
    """The format of the expert weights of one ``apply`` call (``"float"`` or ``"fp8_channel"``), checked: scales
    come with fp8 weights and only with them, float32 and ``[E,2I]`` / ``[E,H]``. Call after ``check_moe_shapes``."""
    if w13_scale is None and w2_scale is None:
        if w13.dtype == FP8_EXPERT_DTYPE or w2.dtype == FP8_EXPERT_DTYPE:
            raise ValueError("fp8 expert weights need their scales: pass w13_scale[E,2I] and w2_scale[E,H]")
        return "float"
    if w13_scale is None or w2_scale is None:
        raise ValueError("pass both w13_scale and w2_scale (fp8_channel experts), or neither (float experts)")
    if w13.dtype != FP8_EXPERT_DTYPE or w2.dtype != FP8_EXPERT_DTYPE:
        raise ValueError(f"w13_scale / w2_scale come with {FP8_EXPERT_DTYPE} expert weights (fp8_channel), got "
                         f"w13 {w13.dtype} and w2 {w2.dtype}")
    expected = ((w13.shape[0], w13.shape[1]), (w2.shape[0], w2.shape[1]))
    if (tuple(w13_scale.shape), tuple(w2_scale.shape)) != expected:
        raise ValueError(f"fp8_channel scales must be w13_scale{list(expected[0])} and w2_scale{list(expected[1])} "
                         f"(one per output row), got {list(w13_scale.shape)} and {list(w2_scale.shape)}")
    if w13_scale.dtype != torch.float32 or w2_scale.dtype != torch.float32:
        raise ValueError(f"fp8_channel scales must be float32, got {w13_scale.dtype} and {w2_scale.dtype}")
    return "fp8_channel"
