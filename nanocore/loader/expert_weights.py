"""Which MoE layers hold their experts in fp8 (``fp8_channel``) instead of dequantizing them at load.

A layer keeps its experts' fp8 ``weight`` and per-row ``weight_scale`` when the checkpoint quantizes every expert
projection (gate, up, down) of that layer to 8-bit float with per-channel (or per-tensor, spread per row)
symmetric scales, in compressed-tensors float-quantized or ``quant_method: fp8`` (no ``weight_block_size``), and the
MoE executor takes ``"fp8_channel"`` on the device (``MoEExecutor.supports_weight_format``). Any other layer is
dequantized to the model dtype (``float_modules.py``), as for an executor of API 1.0 / 1.1. The choice is logged
once per load.
"""
from __future__ import annotations

import logging
import re

import torch

from nanocore.interfaces import MoEExecutor
from nanocore.toolkit.checkpoint import is_ignored
from nanocore.toolkit.checkpoint_formats import CheckpointFormat, group_for, parse_quantization_config

logger = logging.getLogger("nanocore")
FP8_CHANNEL = "fp8_channel"
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
#: ``<layer>.experts.<N>.<proj>`` -> the layer's ``<layer>.experts`` prefix.
_EXPERT_MODULE = re.compile(r"^(?P<layer>.*\.experts)\.\d+\.(gate|up|down)_proj$")


def fp8_channel_reason(fmt: CheckpointFormat | None, experts_prefix: str) -> str | None:
    """None if the checkpoint stores the experts under ``experts_prefix`` as fp8 per-row, else what they are."""
    if fmt is None:
        return "the checkpoint is not quantized"
    if fmt.producer not in ("compressed-tensors", "fp8"):
        return f"quant_method {fmt.producer!r} experts are not fp8"
    for proj in _PROJECTIONS:
        module = f"{experts_prefix}.0.{proj}"
        group = None if is_ignored(module, list(fmt.ignore)) else group_for(fmt, module)
        w = group.scheme.weights if group is not None else None
        if w is None:
            return f"{module} is not quantized"
        if (w.type, w.num_bits, w.strategy, w.symmetric, group.format) not in (
                ("float", 8, "channel", True, "float-quantized"), ("float", 8, "tensor", True, "float-quantized")):
            return f"{module} is {w.num_bits}-bit {w.type} {w.strategy} ({group.format}), not fp8 per channel"
    return None


class ExpertFormats:
    """``format_of(experts_prefix) -> "fp8_channel" | "float"`` for one load, and the modules kept quantized."""

    def __init__(self, quantization_config: dict | None, executor: MoEExecutor | None, device: torch.device):
        self.fmt = parse_quantization_config(quantization_config) if quantization_config else None
        self.executor_reason = ("no MoE executor" if executor is None
                                else executor.supports_weight_format(FP8_CHANNEL, device))
        self.executor_name = type(executor).__name__ if executor is not None else None
        self._formats: dict[str, str] = {}
        self._float_reasons: dict[str, str] = {}

    def format_of(self, experts_prefix: str) -> str:
        """The format the MoE layer ``experts_prefix`` (``model.layers.0.mlp.experts``) holds its experts in."""
        if experts_prefix not in self._formats:
            reason = fp8_channel_reason(self.fmt, experts_prefix)
            if reason is None and self.executor_reason is not None:
                reason = f"the checkpoint's experts are fp8 but {self.executor_reason}"
            self._formats[experts_prefix] = FP8_CHANNEL if reason is None else "float"
            if reason is not None:
                self._float_reasons[experts_prefix] = reason
        return self._formats[experts_prefix]

    def keeps_quantized(self, module: str) -> bool:
        """Whether checkpoint module ``module`` (``...experts.N.gate_proj``) loads as fp8 (not dequantized)."""
        match = _EXPERT_MODULE.match(module)
        return match is not None and self._formats.get(match["layer"]) == FP8_CHANNEL

    def log_choice(self) -> None:
        """One INFO line per load for a quantized checkpoint: which MoE layers keep fp8 experts, and why not."""
        if self.fmt is None or not self._formats:
            return
        fp8 = sum(f == FP8_CHANNEL for f in self._formats.values())
        if fp8:
            logger.info("MoE experts: %d of %d layers hold fp8 weights with per-channel scales (%s takes "
                        "'fp8_channel')%s", fp8, len(self._formats), self.executor_name, self._first_reason("; "))
        else:
            logger.info("MoE experts: dequantized to the model dtype at load%s", self._first_reason(": "))

    def _first_reason(self, sep: str) -> str:
        if not self._float_reasons:
            return ""
        prefix, reason = next(iter(self._float_reasons.items()))
        return f"{sep}{prefix}: {reason}"
