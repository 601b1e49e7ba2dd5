"""Linear methods wrong only at some M, which the random draws (at most 81 rows) may never reach: the explicit
boundary cases must reject them on every run. Each is the correct ``ChannelInt8`` with one kernel path broken."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from nanocore_conformance import LinearMethodConformance, bind_all

# the correct method lives beside this file (mutant modules are loaded by path, not as a package)
_spec = importlib.util.spec_from_file_location("nanocore_mutants_linear_base", Path(__file__).with_name("linear_method.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
ChannelInt8, check_input = _base.ChannelInt8, _base.check_input

TILE = 128


class TiledPathWrongPastOneTile(ChannelInt8):
    """From M = 128 rows a tiled path runs 128-row tiles; the last, partial tile re-reads the first tile's rows."""

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        w = (layer.weight.float() * layer.weight_scale).to(x.dtype)
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] < TILE:
            return F.linear(x, w, bias)
        tiles = [x2[start:start + TILE] for start in range(0, x2.shape[0], TILE)]
        if tiles[-1].shape[0] < TILE:
            tiles[-1] = x2[:tiles[-1].shape[0]]
        out = torch.cat([F.linear(t, w, bias) for t in tiles])
        return out.reshape(*x.shape[:-1], -1)


class DecodePathDropsBias(ChannelInt8):
    """A one-row GEMV path for decode of a single sequence (M = 1) that forgets the bias."""

    def apply(self, layer, x, bias=None):
        check_input(layer, x)
        w = (layer.weight.float() * layer.weight_scale).to(x.dtype)
        if x.numel() == x.shape[-1]:
            return F.linear(x, w)
        return F.linear(x, w, bias)


MUTANTS = [TiledPathWrongPastOneTile, DecodePathDropsBias]
bind_all(globals(), LinearMethodConformance, MUTANTS)
