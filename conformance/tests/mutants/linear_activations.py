"""Linear methods that declare rounded activations: the correct one rounds them per token; the mutants compute
more accurately than they declare, which every bound-only check passes and the activation probe rejects."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore_conformance import LinearMethodConformance, bind_all

# the correct weight format lives beside this file (mutant modules are loaded by path, not as a package)
_spec = importlib.util.spec_from_file_location("nanocore_mutants_linear_base", Path(__file__).with_name("linear_method.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
ChannelInt8, check_input = _base.ChannelInt8, _base.check_input


def round_int8(x2: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """``x2`` rounded to the symmetric int8 grid whose scale covers ``amax`` (and back to float)."""
    scale = amax.clamp_min(1e-12) / 127
    return (x2 / scale).round().clamp(-127, 127) * scale


class TokenInt8(ChannelInt8):
    """int8 weights per channel, activations rounded to int8 with one scale per token."""

    activation_strategy = "token"

    def quant_scheme(self):
        return QuantScheme(weights=QuantArgs(8, "int", "channel"),
                           input_activations=QuantArgs(8, "int", self.activation_strategy, dynamic=True))

    def round_activations(self, x2: torch.Tensor) -> torch.Tensor:
        return round_int8(x2, x2.abs().amax(dim=1, keepdim=True))

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        x2 = self.round_activations(x.reshape(-1, x.shape[-1]).float())
        y = F.linear(x2, layer.weight.float() * layer.weight_scale).to(x.dtype)
        y = y if bias is None else y + bias
        return y.reshape(*x.shape[:-1], -1)


class DeclaresInt8ActivationsRoundsNone(TokenInt8):
    """Declares int8 activations per token but computes from the unrounded ones (a weight-only path taken for
    every batch, e.g. a decode-size switch whose threshold is never reached)."""

    def round_activations(self, x2):
        return x2


class DeclaresPerTensorRoundsPerToken(TokenInt8):
    """Declares one dynamic int8 scale per tensor but gives every token its own (a static or per-tensor scheme
    that runs the per-token quantizer)."""

    activation_strategy = "tensor"


class WrittenFor14RoundsNone(DeclaresInt8ActivationsRoundsNone):
    """The same method written for plugin API 1.4, before the rule: warned and not probed, so it passes."""

    api_version = "1.4"


CORRECT = [TokenInt8, WrittenFor14RoundsNone]
MUTANTS = [DeclaresInt8ActivationsRoundsNone, DeclaresPerTensorRoundsPerToken]
bind_all(globals(), LinearMethodConformance, CORRECT + MUTANTS)
