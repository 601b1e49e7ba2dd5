"""Backends with one planted bug each, bound to the conformance classes without the registry.

Not collected by the normal run (no ``test_`` prefix); test_suite_catches_bugs.py runs them and expects
each selected check to fail.
"""
from __future__ import annotations

import pytest
import torch.nn.functional as F

from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.toolkit.kv import flat_slots
from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore_conformance import (
    KVCodecConformance,
    LinearMethodConformance,
    MoEExecutorConformance,
)


class ScaledLinear(UnquantizedLinearMethod):
    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight * 1.01, bias)  # bug: 1% off


class WritesSlotMinusOne(UnquantizedKVCodec):
    def store(self, cache, k, v, slot_mapping):
        flat_slots(cache.k)[slot_mapping] = k.to(cache.k.dtype)  # bug: -1 writes the last slot
        flat_slots(cache.v)[slot_mapping] = v.to(cache.v.dtype)


class CountsDroppedSlots(EagerMoEExecutor):
    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        return super().apply(x, topk_weights, topk_ids.clamp(0, w13.shape[0] - 1), w13, w2, activation)


def planted(base, cls):
    return type(f"Test{cls.__name__}", (base,), {
        "backend": cls.__name__,
        "backend_entry": pytest.fixture(lambda self: None),
        "backend_cls": pytest.fixture(lambda self: cls),
    })


TestScaledLinear = planted(LinearMethodConformance, ScaledLinear)
TestWritesSlotMinusOne = planted(KVCodecConformance, WritesSlotMinusOne)
TestCountsDroppedSlots = planted(MoEExecutorConformance, CountsDroppedSlots)
