"""LinearMethod: how a linear layer stores its weights and computes ``y = x W^T + b``.

The seams are vLLM's: ``create_weights`` registers parameters on the layer (each carrying the
layer's ``weight_loader`` and ``output_dim`` / ``input_dim`` / ``packed_factor`` attributes so TP
shards and merged qkv / gate_up load correctly), ``process_weights_after_loading`` repacks them, and
``apply`` runs the GEMM. One instance serves one layer.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, ClassVar

import torch

from nanocore.interfaces.base import Backend
from nanocore.interfaces.quant_scheme import QuantScheme

WeightLoader = Callable[..., None]


def set_weight_attrs(param: torch.Tensor, attrs: dict[str, Any]) -> None:
    """Attach loading metadata (``weight_loader``, ``output_dim``, ...) to a parameter."""
    for key, value in attrs.items():
        assert not hasattr(param, key), f"parameter already has attribute {key}"
        setattr(param, key, value)


class LinearMethod(Backend):
    #: (atol, rtol) of ``apply`` against the ``unquantized`` oracle, relative to output scale.
    tolerance: ClassVar[tuple[float, float]] = (1e-5, 1e-5)
    #: Checkpoint ``quantization_config`` this method loads; ``None`` for plain checkpoints.
    quant_method: ClassVar[str | None] = None
    #: Among installed methods loading the same ``quant_method``, ``auto`` picks the highest.
    checkpoint_priority: ClassVar[int] = 0

    @classmethod
    def checkpoint_priority_for(cls, quantization_config: dict | None) -> int:
        """``auto``'s preference for a checkpoint with this ``quantization_config`` (one format can hold
        several schemes, e.g. weight-only or not); the default is ``checkpoint_priority``."""
        return cls.checkpoint_priority

    @abstractmethod
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        weight_loader: WeightLoader,
    ) -> None:
        """Register this layer's parameters (this TP rank's partition) on ``layer``."""

    def quant_scheme(self) -> QuantScheme | None:
        """How this instance (with its options) rounds weights and activations; ``None``: it does not quantize.
        The conformance suite derives the tolerance of ``apply`` from it, so declare what you really compute."""
        return None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack loaded weights for ``apply`` (transpose, quantize, ...). Default: nothing."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``x @ W^T (+ bias)`` with ``x`` of shape ``[..., input_size_per_partition]``."""

    @classmethod
    def quantize(
        cls, weights: dict[str, torch.Tensor], calibration: dict[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Offline side of ``nanocore quantize``: return (checkpoint tensors, ``quantization_config``)."""
        raise NotImplementedError(f"linear method {cls.name!r} does not implement offline quantization")
