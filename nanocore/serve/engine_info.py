"""What the HTTP side needs to know about the engine it serves, as plain data (it may live in another process)."""
from __future__ import annotations

from typing import Any


def backends_in_use(engine) -> dict[str, str | None]:
    """Each kind's backend as resolved ('auto' replaced by what it chose); moe_executor is None for a dense model."""
    from nanocore.runner.worker_process import backend_names

    names = backend_names(engine.loaded, engine.runner.codec)
    names["prefix_cache"] = engine.block_manager.prefix_cache.name
    names["scheduler_policy"] = engine.scheduler.policy_name
    return names


def describe(llm) -> dict[str, Any]:
    """Model, device, limits and backends of ``llm`` (``/version``, ``/v1/models``, the ``n`` check)."""
    engine = llm.engine
    return {"model": engine.config.model, "device": str(engine.device),
            "vocab_size": getattr(engine.loaded.hf_config, "vocab_size", None),
            "architectures": list(getattr(engine.loaded.hf_config, "architectures", None) or []),
            "max_model_len": engine.max_model_len, "max_num_seqs": engine.config.max_num_seqs,
            "backends": backends_in_use(engine)}
