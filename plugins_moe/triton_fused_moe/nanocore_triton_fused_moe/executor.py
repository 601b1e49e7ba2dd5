"""``triton_fused_moe``: the MoEExecutor that aligns slots by sorting and runs two grouped Triton GEMMs."""
from __future__ import annotations

from typing import ClassVar

import torch

from nanocore.interfaces import MoEExecutor, check_moe_shapes, check_options, moe_weight_format
from nanocore.toolkit.capability import cuda_capability_reason, triton_reason
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
    weight_formats = ("float", "fp8_channel")  # fp8 e4m3 experts with per-row scales, widened in registers
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

    def supports_weight_format(self, weight_format: str, device: torch.device) -> str | None:
        """fp8 experts: the Triton path converts fp8 e4m3 in registers, which needs CUDA capability >= 8.9; the
        torch twin (CPU, or ``impl="torch"``) widens them anywhere."""
        reason = super().supports_weight_format(weight_format, device)
        if reason or weight_format != "fp8_channel" or device.type != "cuda" or self.impl == "torch":
            return reason
        return cuda_capability_reason(device, (8, 9), "triton_fused_moe with fp8 expert weights")

    @classmethod
    def tune(cls, num_experts: int, intermediate: int, hidden: int, top_k: int, dtype: torch.dtype, **kwargs):
        """Time tile configs for this expert shape on this GPU and write their table (``nanocore tune moe``)."""
        from nanocore_triton_fused_moe.tune import tune

        return tune(num_experts, intermediate, hidden, top_k, dtype, **kwargs)

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu", *, w13_scale=None, w2_scale=None):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        fp8 = moe_weight_format(w13, w2, w13_scale, w2_scale) == "fp8_channel"
        if x.dtype not in DTYPES or (not fp8 and (w13.dtype != x.dtype or w2.dtype != x.dtype)):
            raise ValueError(f"triton_fused_moe needs x, w13 and w2 in one of {[str(d) for d in DTYPES]} (or fp8 "
                             f"w13 / w2 with scales), got {x.dtype}, {w13.dtype}, {w2.dtype}; use "
                             f"moe_executor='eager' otherwise")
        scales = {"w13_scale": w13_scale, "w2_scale": w2_scale}
        num_tokens, top_k = topk_ids.shape
        if num_tokens == 0:
            return torch.zeros_like(x)
        num_experts, intermediate = w13.shape[0], w2.shape[2]
        config = self.configs.pick(num_tokens, num_experts, intermediate, top_k, x.dtype, x.device,
                                   "fp8_channel" if fp8 else "float")
        if self.impl == "torch" or (self.impl == "auto" and not x.is_cuda):
            return fused_moe_torch(x, topk_weights, topk_ids, w13, w2, block_m=config["BLOCK_M"], **scales)
        from nanocore_triton_fused_moe.kernels import fused_experts  # imports triton only when used

        aligned = align_slots(topk_ids, num_experts, config["BLOCK_M"])
        return fused_experts(x, topk_weights, w13, w2, aligned, top_k, config, **scales)
