"""The shared conformance suite for the ``decode_first`` scheduler policy (default and tiny chunks)."""
import pytest

from nanocore_conformance import SchedulerPolicyConformance


class TestDecodeFirst(SchedulerPolicyConformance):
    backend = "decode_first"


class TestDecodeFirstChunk3(SchedulerPolicyConformance):
    backend = "decode_first"

    @pytest.fixture
    def backend_options(self):
        return {"chunk_size": 3}


class TestDecodeFirstUncapped(SchedulerPolicyConformance):
    backend = "decode_first"

    @pytest.fixture
    def backend_options(self):
        return {"chunk_size": 0}
