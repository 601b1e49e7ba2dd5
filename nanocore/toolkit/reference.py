"""The reference backends (the oracles the conformance suite compares against), public for subclassing.

A backend may extend one (a quantized KV codec that keeps the unquantized layout for some layers, a policy that
reorders ``prefill_first``'s candidates) or delegate to it while being written. These are the classes the core
registers as ``unquantized`` (linear and KV), ``none``, ``eager``, ``prefill_first`` and ``reference``
(structured output).
"""
from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.builtin.no_prefix_cache import NoPrefixCache
from nanocore.builtin.prefill_first import PrefillFirstPolicy
from nanocore.builtin.reference_structured import ReferenceStructuredOutput
from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod

__all__ = ["EagerMoEExecutor", "NoPrefixCache", "PrefillFirstPolicy", "ReferenceStructuredOutput", "UnquantizedKVCodec", "UnquantizedLinearMethod"]
