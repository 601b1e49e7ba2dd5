"""Registers the ``triton_fused_moe`` MoE executor with nanocore."""
from nanocore.hookspecs import hookimpl
from nanocore_triton_fused_moe.executor import TritonFusedMoEExecutor


@hookimpl
def nanocore_moe_executors():
    return {"triton_fused_moe": TritonFusedMoEExecutor}


@hookimpl
def nanocore_env_vars():
    return ["NANOCORE_MOE_CONFIG_DIR"]  # read by this plugin, not an engine field
