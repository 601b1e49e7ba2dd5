"""Stub backends (string.Template) for ``nanocore plugin new``, one per kind.

Each stub delegates to the builtin oracle, so the generated plugin passes the conformance suite as
written; every method a plugin author replaces is marked ``STUB``.
"""

CLASS_SUFFIX = {
    "linear_method": "LinearMethod", "kv_codec": "KVCodec", "prefix_cache": "PrefixCache",
    "moe_executor": "MoEExecutor", "scheduler_policy": "SchedulerPolicy", "structured_output": "StructuredOutput",
}
CONFORMANCE = {
    "linear_method": "LinearMethodConformance", "kv_codec": "KVCodecConformance",
    "prefix_cache": "PrefixCacheConformance", "moe_executor": "MoEExecutorConformance",
    "scheduler_policy": "SchedulerPolicyConformance", "structured_output": "StructuredOutputConformance",
}

HEADER = '''\
"""$kind '$name'.

STUB: this class delegates to nanocore's reference backend (nanocore.toolkit.reference) so that the
conformance suite passes out of the box. Replace every method marked STUB with your implementation; the
contract of each method is its docstring in nanocore.interfaces.$kind.
"""
from __future__ import annotations

'''

_CAPABILITIES = '''\
    api_version = "$api_version"  # the nanocore plugin API this backend targets
    auto_priority = None  # an int lets "auto" choose this backend (highest supported wins)

    @classmethod
    def supports(cls, device):
        """None if this backend runs on ``device``, else why not (shown by `nanocore plugins`)."""
        return None
'''

BACKENDS = {
    "linear_method": '''\
from nanocore.interfaces import LinearMethod, check_options
from nanocore.toolkit.reference import UnquantizedLinearMethod


class $cls(LinearMethod):
''' + _CAPABILITIES + '''
    tolerance = (1e-5, 1e-5)  # (atol relative to output scale, rtol) against the unquantized oracle

    def __init__(self, options=None):
        super().__init__(check_options("$name", dict(options or {}), {}))
        self._reference = UnquantizedLinearMethod()  # STUB

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        self._reference.create_weights(layer, input_size_per_partition, output_partition_sizes, input_size,
                                       output_size, params_dtype, weight_loader)  # STUB

    def process_weights_after_loading(self, layer):
        self._reference.process_weights_after_loading(layer)  # STUB

    def apply(self, layer, x, bias=None):
        return self._reference.apply(layer, x, bias)  # STUB
''',
    "kv_codec": '''\
from nanocore.interfaces import KVCodec, check_options
from nanocore.toolkit.reference import UnquantizedKVCodec


class $cls(KVCodec):
''' + _CAPABILITIES + '''
    tolerance = (1e-5, 1e-5)  # (atol, rtol) of attention over this cache against the unquantized codec

    def __init__(self, options=None):
        super().__init__(check_options("$name", dict(options or {}), {}))
        self._reference = UnquantizedKVCodec()  # STUB

    def layout(self, dtype):
        return self._reference.layout(dtype)  # STUB

    def store(self, cache, k, v, slot_mapping):
        self._reference.store(cache, k, v, slot_mapping)  # STUB

    def gather(self, cache, slots, dtype):
        return self._reference.gather(cache, slots, dtype)  # STUB
''',
    "prefix_cache": '''\
from nanocore.interfaces import PrefixCache, check_options
from nanocore.toolkit.reference import NoPrefixCache


class $cls(PrefixCache):
''' + _CAPABILITIES + '''
    # STUB: it caches nothing; drop this once it keeps every block insert() gives it until evict() returns it
    conformance_requirements = {"keeps_inserted_blocks": False}

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, check_options("$name", dict(options or {}), {}))
        self._reference = NoPrefixCache(block_size, num_blocks)  # STUB: caches nothing

    def match(self, token_ids):
        return self._reference.match(token_ids)  # STUB

    def insert(self, token_ids, block_ids):
        self._reference.insert(token_ids, block_ids)  # STUB

    def acquire(self, block_id):
        self._reference.acquire(block_id)  # STUB

    def release(self, block_id):
        return self._reference.release(block_id)  # STUB

    def evict(self):
        return self._reference.evict()  # STUB
''',
    "moe_executor": '''\
from nanocore.interfaces import MoEExecutor, check_options
from nanocore.toolkit.reference import EagerMoEExecutor


class $cls(MoEExecutor):
''' + _CAPABILITIES + '''
    tolerance = (1e-5, 1e-5)  # (atol, rtol) against the eager oracle
    supports_cuda_graph = False  # True once apply never synchronises with the host
    activations = ("silu",)
    weight_formats = ("float",)  # add "fp8_channel" to take fp8 experts + w13_scale / w2_scale keywords (API 1.2)

    def __init__(self, options=None):
        super().__init__(check_options("$name", dict(options or {}), {}))
        self._reference = EagerMoEExecutor()  # STUB

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        return self._reference.apply(x, topk_weights, topk_ids, w13, w2, activation)  # STUB
''',
    "scheduler_policy": '''\
from nanocore.interfaces import SchedulerPolicy
from nanocore.toolkit.reference import PrefillFirstPolicy


class $cls(SchedulerPolicy):
''' + _CAPABILITIES + '''
    def __init__(self, options=None):
        super().__init__(options)
        self._reference = PrefillFirstPolicy(options)  # STUB: validates its own options

    def schedule(self, state, budget):
        return self._reference.schedule(state, budget)  # STUB
''',
    "structured_output": '''\
from nanocore.interfaces import StructuredOutputBackend, check_options
from nanocore.toolkit.reference import ReferenceStructuredOutput


class $cls(StructuredOutputBackend):
''' + _CAPABILITIES + '''
    constraint_kinds = ReferenceStructuredOutput.constraint_kinds  # STUB: the kinds your compile() accepts

    def __init__(self, vocabulary, options=None):
        super().__init__(vocabulary, check_options("$name", dict(options or {}), {}))
        self._reference = ReferenceStructuredOutput(vocabulary)  # STUB: slow, masks by trying every token

    def compile(self, constraint):
        return self._reference.compile(constraint)  # STUB

    def matcher(self, compiled):
        return self._reference.matcher(compiled)  # STUB
''',
}
