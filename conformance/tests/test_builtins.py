"""Every builtin backend passes the same classes a third party subclasses."""
import pytest

from nanocore_conformance import (
    BackendContractConformance,
    KVCodecConformance,
    LinearMethodConformance,
    MoEExecutorConformance,
    PrefixCacheConformance,
    SchedulerPolicyConformance,
    StructuredOutputConformance,
)


class TestUnquantizedLinear(LinearMethodConformance):
    backend = "unquantized"


class TestUnquantizedKVCodec(KVCodecConformance):
    backend = "unquantized"


class TestNoPrefixCache(PrefixCacheConformance):
    backend = "none"


class TestEagerMoE(MoEExecutorConformance):
    backend = "eager"


class TestPrefillFirst(SchedulerPolicyConformance):
    backend = "prefill_first"


class TestPrefillFirstChunked(SchedulerPolicyConformance):
    backend = "prefill_first"

    @pytest.fixture
    def backend_options(self):
        return {"chunk_size": 3}


class TestReferenceStructuredOutput(StructuredOutputConformance):
    backend = "reference"


class TestContractAlone(BackendContractConformance):
    kind = "kv_codec"
    backend = "nanocore:unquantized"
