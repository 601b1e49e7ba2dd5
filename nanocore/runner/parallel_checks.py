"""Errors a tensor / expert / pipeline-parallel layout can be given before any rank starts: sizes the model must
divide, combinations not built."""
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
    check_pipeline(config, hf_config)


def check_pipeline(config: EngineConfig, hf_config) -> None:
    """Pipeline stages need a layer each; expert parallelism inside a stage is not built."""
    pp, layers = config.pipeline_parallel_size, getattr(hf_config, "num_hidden_layers", None)
    if pp == 1:
        return
    if config.expert_parallel_size > 1:
        raise ValueError(f"pipeline_parallel_size={pp} with expert_parallel_size={config.expert_parallel_size} is "
                         f"not supported; use tensor_parallel_size within each stage (experts split by TP)")
    if layers is not None and layers < pp:
        raise ValueError(f"pipeline_parallel_size {pp} needs at least {pp} decoder layers but {config.model!r} has "
                         f"{layers}; lower pipeline_parallel_size to at most {layers}")


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
    """One engine spans every rank the launcher started: TP and EP groups overlap, so it needs max(TP, EP) x PP."""
    tp, ep, pp = config.tensor_parallel_size, config.expert_parallel_size, config.pipeline_parallel_size
    needed = world_size_of(config)
    if needed == world_size:
        return
    started = f"the launcher started {world_size} rank(s) (WORLD_SIZE) but tensor_parallel_size={tp} and " \
              f"expert_parallel_size={ep}"
    if pp == 1:
        raise ValueError(f"{started} make an engine of {needed} (the larger of the two); pass --tensor-parallel-size "
                         f"{world_size} (or --expert-parallel-size {world_size} for a mixture-of-experts model), or "
                         f"start nnodes x nproc-per-node = {needed} ranks")
    fix = (f"pass --tensor-parallel-size {world_size // pp} with --pipeline-parallel-size {pp}" if world_size % pp == 0
           else f"pass a --pipeline-parallel-size that divides {world_size}")
    raise ValueError(f"{started} with pipeline_parallel_size={pp} make an engine of {needed} (the larger of the two "
                     f"times the stages); {fix}, or start nnodes x nproc-per-node = {needed} ranks")
