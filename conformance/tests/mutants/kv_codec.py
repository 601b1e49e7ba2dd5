"""KV codecs the suite must accept (CORRECT) and reject (MUTANTS)."""
from __future__ import annotations

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.toolkit.kv import flat_slots
from nanocore_conformance import KVCodecConformance, bind_all


class PlainKVCodec(UnquantizedKVCodec):
    """The oracle itself, seen as a third party's class."""


class WritesSlotMinusOne(UnquantizedKVCodec):
    """store writes slot -1 (Python's last slot) instead of skipping it."""

    def store(self, cache, k, v, slot_mapping):
        flat_slots(cache.k)[slot_mapping] = k.to(cache.k.dtype)
        flat_slots(cache.v)[slot_mapping] = v.to(cache.v.dtype)


CORRECT = [PlainKVCodec]
MUTANTS = [WritesSlotMinusOne]
bind_all(globals(), KVCodecConformance, CORRECT + MUTANTS)
