"""What a linear method computes with, declared in compressed-tensors' vocabulary.

A ``QuantScheme`` says how weights (and, for W8A8-style methods, activations) are rounded: bits, int or
float, the scale granularity, symmetric or not. The conformance suite derives the tolerance of ``apply``
from it (the rounding noise the format allows), and checkpoint routing compares it with what a checkpoint
holds. The field names and values are those of compressed-tensors' ``QuantizationArgs``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

QuantType = Literal["int", "float"]
#: tensor: one scale; channel: one per output row; group: one per ``group_size`` inputs of a row;
#: token: one per activation row (dynamic); block: one per ``block_structure`` tile of the weight.
QuantStrategy = Literal["tensor", "channel", "group", "token", "block"]


@dataclass(frozen=True)
class QuantArgs:
    num_bits: int
    type: QuantType = "int"
    strategy: QuantStrategy = "channel"
    group_size: int | None = None
    symmetric: bool = True
    #: Activations only: scales computed at run time (True) or loaded from the checkpoint (False).
    dynamic: bool = False
    #: strategy "block": (rows, columns) of one scale's tile.
    block_structure: tuple[int, int] | None = None

    def __post_init__(self):
        if self.type not in ("int", "float"):
            raise ValueError(f"QuantArgs.type must be 'int' or 'float', got {self.type!r}")
        if self.strategy == "group" and not self.group_size:
            raise ValueError("QuantArgs with strategy 'group' needs a positive group_size")
        if self.type == "float" and self.num_bits != 8:
            raise ValueError(f"float quantization is fp8 (num_bits=8), got num_bits={self.num_bits}")


@dataclass(frozen=True)
class QuantScheme:
    """``weights`` None means weights in the model dtype; ``input_activations`` None means activations are
    not quantized (weight-only)."""

    weights: QuantArgs | None = None
    input_activations: QuantArgs | None = None

    @property
    def is_quantized(self) -> bool:
        return self.weights is not None or self.input_activations is not None
