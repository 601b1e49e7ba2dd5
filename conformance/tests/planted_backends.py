"""Backends with one planted bug each, bound to the conformance classes without the registry.

Not collected by the normal run (no ``test_`` prefix); test_suite_catches_bugs.py runs them and expects
each selected check to fail.
"""
from __future__ import annotations

import pytest

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.toolkit.kv import flat_slots
from nanocore_conformance import (
    KVCodecConformance,
)


class WritesSlotMinusOne(UnquantizedKVCodec):
    def store(self, cache, k, v, slot_mapping):
        flat_slots(cache.k)[slot_mapping] = k.to(cache.k.dtype)  # bug: -1 writes the last slot
        flat_slots(cache.v)[slot_mapping] = v.to(cache.v.dtype)


def planted(base, cls):
    return type(f"Test{cls.__name__}", (base,), {
        "backend": cls.__name__,
        "backend_entry": pytest.fixture(lambda self: None),
        "backend_cls": pytest.fixture(lambda self: cls),
    })


TestWritesSlotMinusOne = planted(KVCodecConformance, WritesSlotMinusOne)
