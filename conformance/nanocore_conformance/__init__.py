"""The shared conformance suite: subclass one class per backend, set ``backend``, run pytest.

    from nanocore_conformance import LinearMethodConformance

    class TestMine(LinearMethodConformance):
        backend = "mine"
"""
from nanocore_conformance.binding import bind, bind_all
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.kv_codec import KVCodecConformance
from nanocore_conformance.linear import LinearMethodConformance
from nanocore_conformance.moe import MoEExecutorConformance
from nanocore_conformance.prefix_cache import PrefixCacheConformance
from nanocore_conformance.scheduler_policy import SchedulerPolicyConformance
from nanocore_conformance.structured_output import StructuredOutputConformance

#: Kind (as spelled in the config) -> the base class testing it.
CLASSES_BY_KIND = {
    "linear_method": LinearMethodConformance,
    "kv_codec": KVCodecConformance,
    "prefix_cache": PrefixCacheConformance,
    "moe_executor": MoEExecutorConformance,
    "scheduler_policy": SchedulerPolicyConformance,
    "structured_output": StructuredOutputConformance,
}

__all__ = [
    "BackendContractConformance", "KVCodecConformance", "LinearMethodConformance", "MoEExecutorConformance",
    "PrefixCacheConformance", "SchedulerPolicyConformance", "StructuredOutputConformance", "CLASSES_BY_KIND", "bind", "bind_all",
]
