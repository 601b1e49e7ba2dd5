"""Reference backends the core registers itself, through the same hooks as any plugin."""
from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.builtin.no_prefix_cache import NoPrefixCache
from nanocore.builtin.prefill_first import PrefillFirstPolicy
from nanocore.builtin.reference_structured import ReferenceStructuredOutput
from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore.hookspecs import hookimpl

#: The name shown for the builtins and accepted in ``"nanocore:name"``: the import name (the distribution on the
#: package index is ``nanocore-llm``), kept so qualified names written before the rename still resolve.
BUILTIN_DISTRIBUTION = "nanocore"


@hookimpl
def nanocore_linear_methods():
    return {"unquantized": UnquantizedLinearMethod}


@hookimpl
def nanocore_kv_codecs():
    return {"unquantized": UnquantizedKVCodec}


@hookimpl
def nanocore_prefix_caches():
    return {"none": NoPrefixCache}


@hookimpl
def nanocore_moe_executors():
    return {"eager": EagerMoEExecutor}


@hookimpl
def nanocore_scheduler_policies():
    return {"prefill_first": PrefillFirstPolicy}


@hookimpl
def nanocore_structured_output_backends():
    return {"reference": ReferenceStructuredOutput}
