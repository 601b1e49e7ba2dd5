"""``triton_fused_moe``: the MoEExecutor that aligns slots by sorting and runs two grouped Triton GEMMs."""
from __future__ import annotations

from typing import ClassVar

import torch

from nanocore.interfaces import MoEExecutor, check_moe_shapes, check_options
from nanocore.toolkit.capability import triton_reason
from nanocore_triton_fused_moe.align import align_slots
from nanocore_triton_fused_moe.configs import ConfigTable
from nanocore_triton_fused_moe.reference import fused_moe_torch

IMPLS = ("auto", "triton", "torch")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TritonFusedMoEExecutor(MoEExecutor):
    """Options: ``impl`` ("auto": Triton on CUDA, the torch twin elsewhere; "triton": Triton, run by the
    interpreter on CPU tensors; "torch": the twin) and ``config_dir`` (tuned tables searched first)."""

    auto_priority = 10
    supports_cuda_graph = True  # alignment and grids depend on shapes only: no host synchronisation
    tolerance = (2e-2, 2e-2)  # bf16: the intermediate is rounded once (eager rounds gate_up and h)
    activations = ("silu",)
    OPTIONS: ClassVar[dict[str, type]] = {"impl": str, "config_dir": str}

    def __init__(self, options=None):
        super().__init__(options)
        check_options("triton_fused_moe", self.options, self.OPTIONS)
        self.impl = self.options.get("impl", "auto")
        if self.impl not in IMPLS:
            raise ValueError(f"triton_fused_moe option impl must be one of {list(IMPLS)}, got {self.impl!r}")
        self.configs = ConfigTable(self.options.get("config_dir"))

    @classmethod
    def supports(cls, device: torch.device) -> str | None:
        reason = triton_reason(device, "triton_fused_moe")
        return reason and f"{reason}; use moe_executor='eager' there"

    @classmethod
    def tune(cls, num_experts: int, intermediate: int, hidden: int, top_k: int, dtype: torch.dtype, **kwargs):
        """Time tile configs for this expert shape on this GPU and write their table (``nanocore tune moe``)."""
        from nanocore_triton_fused_moe.tune import tune

        return tune(num_experts, intermediate, hidden, top_k, dtype, **kwargs)

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        if x.dtype not in DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
            raise ValueError(f"triton_fused_moe needs x, w13 and w2 in one of {[str(d) for d in DTYPES]}, "
                             f"got {x.dtype}, {w13.dtype}, {w2.dtype}; use moe_executor='eager' otherwise")
        num_tokens, top_k = topk_ids.shape
        if num_tokens == 0:
            return torch.zeros_like(x)
        num_experts, intermediate = w13.shape[0], w2.shape[2]
        config = self.configs.pick(num_tokens, num_experts, intermediate, top_k, x.dtype, x.device)
        if self.impl == "torch" or (self.impl == "auto" and not x.is_cuda):
            return fused_moe_torch(x, topk_weights, topk_ids, w13, w2, block_m=config["BLOCK_M"])
        from nanocore_triton_fused_moe.kernels import fused_experts  # imports triton only when used

        aligned = align_slots(topk_ids, num_experts, config["BLOCK_M"])
        return fused_experts(x, topk_weights, w13, w2, aligned, top_k, config)
