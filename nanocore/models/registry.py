"""HF ``architectures`` name -> model class, imported lazily."""
from __future__ import annotations

import importlib

import torch

from nanocore.models.base import ModelBuildContext

#: Architecture -> "module:Class". Add a model by adding a line.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "nanocore.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "nanocore.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "nanocore.models.qwen3:Qwen3ForCausalLM",
    "Qwen2MoeForCausalLM": "nanocore.models.qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "nanocore.models.qwen3_moe:Qwen3MoeForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def model_class(hf_config) -> type:
    names = list(getattr(hf_config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            module, _, cls = ARCHITECTURES[name].partition(":")
            return getattr(importlib.import_module(module), cls)
    raise ValueError(f"config.json declares architectures {names or 'none'}; nanocore supports "
                     f"{supported_architectures()} (set 'architectures' in config.json to one of them)")


def build_model(hf_config, build: ModelBuildContext) -> torch.nn.Module:
    """Instantiate the model for ``hf_config`` with parameters created directly on ``build.device``."""
    cls = model_class(hf_config)
    with torch.device(build.device):
        return cls(hf_config, build)
