"""Stacked expert weights of one MoE layer and their loading from per-expert checkpoint tensors.

``ExpertWeights`` adds ``w13[E_local, 2I, H]`` (gate rows then up rows) and ``w2[E_local, H, I]`` to the layer, in
the model dtype (``"float"``) or as fp8 e4m3 with float32 per-row scales ``w13_scale[E_local, 2I]`` /
``w2_scale[E_local, H]`` (``"fp8_channel"``, see ``nanocore.interfaces.moe_executor``). Loaders take one checkpoint
tensor of global expert ``expert_id`` and shard ``w1`` (gate), ``w3`` (up) or ``w2`` (down): experts of other
expert-parallel ranks are skipped, and under tensor parallelism the intermediate dimension is sliced per rank
(gate / up rows, down columns; a scale follows its rows: gate / up scales are sliced, down scales are whole).
"""
from __future__ import annotations

import torch
from torch import nn

from nanocore.interfaces import WEIGHT_FORMATS, set_weight_attrs
from nanocore.interfaces.moe_executor import FP8_EXPERT_DTYPE


class ExpertWeights:
    """Creates and loads one layer's expert tensors; ``executor_kwargs()`` are the scales ``apply`` gets."""

    def __init__(self, layer: nn.Module, num_local_experts: int, hidden_size: int, params_dtype: torch.dtype,
                 weight_format: str = "float"):
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown expert weight format {weight_format!r}; expected one of {list(WEIGHT_FORMATS)}")
        self.layer, self.weight_format = layer, weight_format
        fp8 = weight_format == "fp8_channel"
        i, dtype = layer.intermediate_per_rank, FP8_EXPERT_DTYPE if fp8 else params_dtype
        layer.w13 = self._param((num_local_experts, 2 * i, hidden_size), dtype, self.load_weight)
        layer.w2 = self._param((num_local_experts, hidden_size, i), dtype, self.load_weight)
        if fp8:
            layer.w13_scale = self._param((num_local_experts, 2 * i), torch.float32, self.load_scale)
            layer.w2_scale = self._param((num_local_experts, hidden_size), torch.float32, self.load_scale)

    @staticmethod
    def _param(shape, dtype, loader) -> nn.Parameter:
        param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        set_weight_attrs(param, {"weight_loader": loader})
        return param

    def param_names(self) -> tuple[str, ...]:
        return ("w13", "w2", "w13_scale", "w2_scale") if self.weight_format == "fp8_channel" else ("w13", "w2")

    def executor_kwargs(self) -> dict[str, torch.Tensor]:
        if self.weight_format != "fp8_channel":
            return {}
        return {"w13_scale": self.layer.w13_scale, "w2_scale": self.layer.w2_scale}

    def _local(self, expert_id: int, shard_id: str) -> int | None:
        layer = self.layer
        if not 0 <= expert_id < layer.num_experts:
            raise ValueError(f"checkpoint has expert {expert_id} but the config says num_experts={layer.num_experts}")
        if shard_id not in ("w1", "w3", "w2"):
            raise ValueError(f"unknown expert shard {shard_id!r}; expected 'w1' (gate), 'w3' (up) or 'w2' (down)")
        local = expert_id - layer.expert_start
        return local if 0 <= local < layer.num_local_experts else None  # None: another expert-parallel rank's

    def _rank(self) -> int:
        return self.layer.parallel.tp_rank if self.layer.tp_shards > 1 else 0

    def load_weight(self, param: nn.Parameter, loaded_weight: torch.Tensor, expert_id: int, shard_id: str) -> None:
        """Copy one checkpoint weight of global expert ``expert_id`` into its rows / columns of ``param``."""
        local = self._local(expert_id, shard_id)
        if local is None:
            return
        if param.dtype == FP8_EXPERT_DTYPE and loaded_weight.dtype != FP8_EXPERT_DTYPE:
            raise ValueError(f"expert {expert_id} {shard_id} is {loaded_weight.dtype} but this layer holds fp8 e4m3 "
                             f"experts (the checkpoint's config says they are fp8 per channel)")
        i = self.layer.intermediate_per_rank
        full = i * self.layer.tp_shards
        if shard_id in ("w1", "w3"):
            dst, dim, expected = param.data[local].narrow(0, 0 if shard_id == "w1" else i, i), 0, (full, param.shape[2])
        else:
            dst, dim, expected = param.data[local], 1, (param.shape[1], full)
        if tuple(loaded_weight.shape) != expected:
            raise ValueError(
                f"expert {expert_id} {shard_id} has shape {tuple(loaded_weight.shape)}, expected {expected}; "
                f"check moe_intermediate_size / hidden_size in config.json")
        dst.copy_(loaded_weight.narrow(dim, self._rank() * i, i))

    def load_scale(self, param: nn.Parameter, loaded_scale: torch.Tensor, expert_id: int, shard_id: str) -> None:
        """One checkpoint ``weight_scale`` (per row ``[N, 1]`` / ``[N]``, or one per tensor, spread over its rows)."""
        local = self._local(expert_id, shard_id)
        if local is None:
            return
        i = self.layer.intermediate_per_rank
        rows = i * self.layer.tp_shards if shard_id in ("w1", "w3") else param.shape[1]
        if loaded_scale.numel() == 1:
            loaded_scale = loaded_scale.reshape(1).expand(rows)
        elif loaded_scale.numel() != rows or loaded_scale.dim() > 2 or (
                loaded_scale.dim() == 2 and loaded_scale.shape[1] != 1):
            raise ValueError(f"expert {expert_id} {shard_id} weight_scale has shape {tuple(loaded_scale.shape)}; "
                             f"expected one scale per output row ([{rows}, 1]) or one per tensor")
        scale = loaded_scale.reshape(rows).float()
        if shard_id == "w2":
            param.data[local].copy_(scale)
        else:
            param.data[local].narrow(0, 0 if shard_id == "w1" else i, i).copy_(scale.narrow(0, self._rank() * i, i))
