"""What every model gets from its builder, and the checkpoint-name plumbing every CausalLM shares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from nanocore.distributed import ParallelContext
from nanocore.interfaces import LinearMethod, MoEExecutor
from nanocore.layers.norm import default_weight_loader


@dataclass
class ModelBuildContext:
    """dtype / device / parallel state, and a LinearMethod per linear layer (by its prefix)."""

    dtype: torch.dtype
    device: torch.device
    parallel: ParallelContext
    linear_method_factory: Callable[[str], LinearMethod]
    moe_executor: MoEExecutor | None = None
    moe_shared_expert_overlap: bool | None = None  # None: the module default (nanocore.layers.moe)
    #: ``experts_prefix -> "float" | "fp8_channel"``: how a MoE layer holds its experts (None: float everywhere).
    moe_weight_format: Callable[[str], str] | None = None


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model (missing, unknown or misshapen tensors)."""


class CausalLMBase(nn.Module):
    """Maps HF tensor names onto nanocore parameters: merged projections, TP shards, tied embeddings.

    Subclasses list ``stacked_params``: (merged module name, HF module name, shard id).
    """

    stacked_params: list[tuple[str, str, object]] = []
    #: HF tensors that carry no weights (old checkpoints store rotary tables).
    ignored_suffixes: tuple[str, ...] = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
    tie_word_embeddings: bool = False

    def holds(self, hf_name: str) -> bool:
        """Whether this rank's model holds checkpoint tensor ``hf_name`` (False: a pipeline stage elsewhere does)."""
        return True

    def map_name(self, hf_name: str) -> tuple[str, tuple]:
        """(nanocore parameter name, extra weight_loader args) of one HF tensor.

        Merged projections pass ``(shard_id,)``; a MoE model may override this to pass ``(expert_id, shard_id)``.
        """
        for merged, original, shard_id in self.stacked_params:
            if f".{original}." in hf_name:
                return hf_name.replace(f".{original}.", f".{merged}."), (shard_id,)
        return hf_name, ()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load (hf_name, tensor) pairs; returns the loaded keys (see ``expected_weight_keys``)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if hf_name.endswith(self.ignored_suffixes):
                continue
            if self.tie_word_embeddings and hf_name.startswith("lm_head."):
                continue  # the LM head shares the embedding table
            if not self.holds(hf_name):
                continue  # another pipeline stage's tensor
            name, loader_args = self.map_name(hf_name)
            param = params.get(name)
            if param is None:
                raise CheckpointError(
                    f"checkpoint tensor {hf_name!r} has no matching parameter in {type(self).__name__}; "
                    f"is 'architectures' in config.json right, and does the linear method match the checkpoint?")
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor, *loader_args)
            except ValueError as exc:
                raise CheckpointError(f"cannot load checkpoint tensor {hf_name!r}: {exc}") from None
            loaded |= self._loaded_keys(name, loader_args)
        return loaded

    def _loaded_keys(self, name: str, loader_args: tuple) -> set[str]:
        module_name, _, _ = name.rpartition(".")
        shard_ids = getattr(self.get_submodule(module_name), "shard_ids", [None])
        if len(shard_ids) == 1:
            return {name}
        return {f"{name}[{s}]" for s in (shard_ids if not loader_args else loader_args[-1:])}

    def expected_weight_keys(self) -> set[str]:
        """Keys ``load_weights`` must have returned: every parameter with a ``weight_loader``, per shard.

        A LinearMethod parameter without a ``weight_loader`` is computed later, not loaded.
        """
        expected, seen = set(), set()
        for module_name, module in self.named_modules():
            shard_ids = getattr(module, "shard_ids", [None])
            for param_name, param in module.named_parameters(recurse=False):
                if id(param) in seen or not hasattr(param, "weight_loader"):
                    continue
                seen.add(id(param))
                name = f"{module_name}.{param_name}" if module_name else param_name
                expected |= {name} if len(shard_ids) == 1 else {f"{name}[{s}]" for s in shard_ids}
        return expected

    def linear_layers(self) -> list[nn.Module]:
        """Modules whose weights a LinearMethod owns (for process_weights_after_loading)."""
        return [m for m in self.modules() if getattr(m, "linear_method", None) is not None]


def check_all_loaded(model: CausalLMBase, loaded: set[str], source: str) -> None:
    """Raise naming the parameters that ``source`` did not provide."""
    missing = sorted(model.expected_weight_keys() - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(
            f"checkpoint {source} is missing {len(missing)} tensor(s) the model needs: {shown} "
            f"(names after merging q/k/v into qkv_proj and gate/up into gate_up_proj); "
            f"the checkpoint is incomplete or does not match its config.json")
