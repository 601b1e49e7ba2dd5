"""The six extension points, one small module each."""
from nanocore.interfaces.base import API_VERSION, Backend, builtin_options, check_options, choice_option
from nanocore.interfaces.kv_codec import KVCache, KVCodec, KVLayout
from nanocore.interfaces.linear_method import LinearMethod, set_weight_attrs
from nanocore.interfaces.moe_executor import WEIGHT_FORMATS, MoEExecutor, check_moe_shapes, moe_weight_format
from nanocore.interfaces.prefix_cache import PrefixCache
from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.interfaces.scheduler_policy import (
    ScheduleDecision,
    ScheduledItem,
    SchedulerPolicy,
    SchedulerState,
    SequenceView,
    StepBudget,
    add_prefill_chunks,
)
from nanocore.interfaces.structured_output import (
    CONSTRAINT_KINDS,
    Constraint,
    StructuredOutputBackend,
    StructuredOutputMatcher,
    TokenVocabulary,
)

#: Kind name -> (interface class, hook name). Kinds are spelled as in config fields and the CLI.
KINDS: dict[str, tuple[type[Backend], str]] = {
    "linear_method": (LinearMethod, "nanocore_linear_methods"),
    "kv_codec": (KVCodec, "nanocore_kv_codecs"),
    "prefix_cache": (PrefixCache, "nanocore_prefix_caches"),
    "moe_executor": (MoEExecutor, "nanocore_moe_executors"),
    "scheduler_policy": (SchedulerPolicy, "nanocore_scheduler_policies"),
    "structured_output": (StructuredOutputBackend, "nanocore_structured_output_backends"),
}

__all__ = [
    "API_VERSION", "Backend", "builtin_options", "check_options", "choice_option", "KVCache", "KVCodec", "KVLayout",
    "LinearMethod", "set_weight_attrs", "MoEExecutor", "check_moe_shapes", "moe_weight_format", "WEIGHT_FORMATS", "PrefixCache", "QuantArgs", "QuantScheme", "ScheduleDecision",
    "ScheduledItem", "SchedulerPolicy", "SchedulerState", "SequenceView", "StepBudget", "add_prefill_chunks", "KINDS",
    "CONSTRAINT_KINDS", "Constraint", "StructuredOutputBackend", "StructuredOutputMatcher", "TokenVocabulary",
]
