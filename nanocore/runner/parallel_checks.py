"""Errors a tensor / expert-parallel layout can be given before any rank starts: sizes the model must divide."""
from __future__ import annotations

from nanocore.config import EngineConfig
from nanocore.runner.worker_process import world_size_of


def check_parallel_config(config: EngineConfig) -> None:
    """Errors we can give before starting any process."""
    from nanocore.loader.model_loader import resolve_model_source

    world_size_of(config)
    hf_config, _ = resolve_model_source(config.model)  # also converts 'default' once, before workers race to
    is_moe = getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
    if config.expert_parallel_size > 1 and not is_moe:
        raise ValueError(f"expert_parallel_size={config.expert_parallel_size} needs a mixture-of-experts model but "
                         f"{config.model!r} is dense; use tensor_parallel_size instead")
    problems = sharding_problems(hf_config, config.tensor_parallel_size, config.expert_parallel_size)
    if problems:
        raise ValueError(f"{config.model!r} cannot be split with tensor_parallel_size={config.tensor_parallel_size} "
                         f"and expert_parallel_size={config.expert_parallel_size}: {'; '.join(problems)}")


def sharding_problems(hf_config, tp: int, ep: int) -> list[str]:
    """The model sizes a TP / EP layout must divide (the layers check them again when they are built)."""
    heads = getattr(hf_config, "num_attention_heads", None)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    experts = getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
    problems = []
    if heads and heads % tp:
        problems.append(f"num_attention_heads {heads} is not divisible by {tp}")
    if kv_heads and kv_heads % tp and tp % kv_heads:  # fewer KV heads than ranks: each is replicated
        problems.append(f"num_key_value_heads {kv_heads} and {tp} do not divide one another")
    if experts and experts % ep:
        problems.append(f"num_experts {experts} is not divisible by expert_parallel_size {ep}")
    moe_size = getattr(hf_config, "moe_intermediate_size", None)
    if experts and ep == 1 and moe_size and moe_size % tp:  # without EP, TP splits each expert
        problems.append(f"moe_intermediate_size {moe_size} is not divisible by {tp}")
    return problems


def check_world_size(config: EngineConfig, world_size: int) -> None:
    """One engine spans every rank the launcher started: TP and EP groups overlap, so it needs max(TP, EP)."""
    tp, ep = config.tensor_parallel_size, config.expert_parallel_size
    needed = world_size_of(config)
    if needed != world_size:
        raise ValueError(f"the launcher started {world_size} rank(s) (WORLD_SIZE) but tensor_parallel_size={tp} and "
                         f"expert_parallel_size={ep} make an engine of {needed} (the larger of the two); pass "
                         f"--tensor-parallel-size {world_size} (or --expert-parallel-size {world_size} for a "
                         f"mixture-of-experts model), or start nnodes x nproc-per-node = {needed} ranks")
