"""``triton_fused_moe`` for nanocore: the experts of a MoE layer as two grouped Triton GEMMs."""
from nanocore_triton_fused_moe.executor import TritonFusedMoEExecutor

__all__ = ["TritonFusedMoEExecutor"]
