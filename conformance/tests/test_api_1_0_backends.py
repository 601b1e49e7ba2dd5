"""One correct backend per kind, written the way plugin API 1.0's docs said (``api_version = "1.0"``): nothing the
contract added later (no ``quant_scheme()``, no ``SchedulerState.retry`` / ``steps_waited``, no ``weight_formats``).
The 1.x promise: each runs through today's conformance classes and passes, with a deprecation warning at most (a rule
added after 1.0 spares them, or the suite applies 1.0's version of it)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nanocore.interfaces import (KVCache, KVCodec, KVLayout, LinearMethod, MoEExecutor, PrefixCache,
                                 ScheduleDecision, SchedulerPolicy, add_prefill_chunks, check_moe_shapes,
                                 set_weight_attrs)
from nanocore_conformance import (KVCodecConformance, LinearMethodConformance, MoEExecutorConformance,
                                  PrefixCacheConformance, SchedulerPolicyConformance, bind)
from nanocore_conformance.linear_legacy import legacy_tolerance
from nanocore_conformance.prefix_cache import holds_cache_rules
from nanocore_conformance.scheduler_policy import strict_retries

GROUP = 32


class OnTheFlyInt4(LinearMethod):
    """Symmetric int4 weights, one scale per 32 inputs of a row, quantized from the float checkpoint when loaded
    (1.0: without ``quantize`` the suite loads W itself into ``weight``); declares only ``tolerance``."""

    api_version = "1.0"
    #: 1.0: (atol, rtol) of apply against unquantized, atol relative to the output scale (max |x| |W|^T)
    tolerance = (0.1, 0.0)
    conformance_requirements = {"input_size_multiple": GROUP}

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        weight = torch.nn.Parameter(torch.empty(sum(output_partition_sizes), input_size_per_partition,
                                                dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, {"weight_loader": weight_loader, "output_dim": 0, "input_dim": 1})
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer):
        w = layer.weight.data.float()
        groups = w.reshape(w.shape[0], -1, GROUP)
        scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 7
        layer.register_buffer("weight_int4", (groups / scale).round().clamp(-7, 7).to(torch.int8))
        layer.register_buffer("weight_group_scale", scale)
        del layer.weight

    def apply(self, layer, x, bias=None):
        num_rows, num_groups = layer.weight_int4.shape[:2]
        if x.shape[-1] != num_groups * GROUP:
            raise ValueError(f"input has {x.shape[-1]} features, this layer takes {num_groups * GROUP}")
        w = (layer.weight_int4.float() * layer.weight_group_scale).reshape(num_rows, -1)
        return F.linear(x, w.to(x.dtype), bias)


class Int8TokenHeadCodec(KVCodec):
    """int8 K and V, one float32 scale per (token, head): amax / 127, round to nearest."""

    api_version = "1.0"
    tolerance = (8e-2, 8e-2)

    def layout(self, dtype):
        return KVLayout(k_dtype=torch.int8, v_dtype=torch.int8, k_scale="token_head", v_scale="token_head")

    def store(self, cache: KVCache, k, v, slot_mapping):
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        for x, values, scales in ((k[keep], cache.k, cache.k_scale), (v[keep], cache.v, cache.v_scale)):
            scale = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127
            values.view(-1, *values.shape[2:])[slots] = (x.float() / scale).round().clamp(-127, 127).to(torch.int8)
            scales.view(-1, *scales.shape[2:])[slots] = scale

    def gather(self, cache: KVCache, slots, dtype):
        def read(values, scales):
            return (values.view(-1, *values.shape[2:])[slots].float() * scales.view(-1, *scales.shape[2:])[slots])
        return read(cache.k, cache.k_scale).to(dtype), read(cache.v, cache.v_scale).to(dtype)


class ChainedTupleCache(PrefixCache):
    """Each block keyed by (its parent's key, its tokens): exact keys; released blocks evicted oldest first."""

    api_version = "1.0"

    def __init__(self, block_size, num_blocks, options=None):
        super().__init__(block_size, num_blocks, options)
        self.block_of, self.key_of, self.released = {}, {}, {}

    def keys(self, token_ids, num_blocks):
        keys, key = [], None
        for i in range(num_blocks):
            key = (key, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            keys.append(key)
        return keys

    def match(self, token_ids):
        hits = []
        for key in self.keys(token_ids, len(token_ids) // self.block_size):
            if key not in self.block_of:
                break
            hits.append(self.block_of[key])
        return hits

    def insert(self, token_ids, block_ids):
        for key, block in zip(self.keys(token_ids, len(block_ids)), block_ids):
            if key not in self.block_of and block not in self.key_of:
                self.block_of[key], self.key_of[block] = block, key

    def acquire(self, block_id):
        self.released.pop(block_id, None)

    def release(self, block_id):
        if block_id not in self.key_of:
            return False
        self.released[block_id] = None
        return True

    def evict(self):
        if not self.released:
            return None
        block = next(iter(self.released))
        del self.released[block], self.block_of[self.key_of.pop(block)]
        return block


class LoopMoE(MoEExecutor):
    """One expert at a time over the tokens routed to it (the docstring's formula, nothing fused)."""

    api_version = "1.0"

    def apply(self, x, topk_weights, topk_ids, w13, w2, activation="silu"):
        check_moe_shapes(x, topk_weights, topk_ids, w13, w2, activation, self.activations)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        inter = w2.shape[2]
        for expert in range(w13.shape[0]):
            tokens, slots = (topk_ids == expert).nonzero(as_tuple=True)
            if tokens.numel() == 0:
                continue
            h = x[tokens].float() @ w13[expert].float().t()
            y = (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[expert].float().t()
            out.index_add_(0, tokens, y * topk_weights[tokens, slots].float().unsqueeze(1))
        return out.to(x.dtype)


class AgingShortestFirst(SchedulerPolicy):
    """Running prefills, then waiting prompts shortest first; a prompt passed over ``max_passes`` times goes to the
    front (aging, counted by the policy itself: 1.0's state does not say how long a sequence waited). Decodes when
    no prefill fits."""

    api_version = "1.0"
    conformance_requirements = {"admission_order": None}  # shortest first overtakes earlier arrivals
    max_passes = 3

    def __init__(self, options=None):
        super().__init__(options)
        self.passes: dict[int, int] = {}

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        prefilling = [s for s in state.running if s.num_uncomputed_tokens > 1]
        aged = [s for s in state.waiting if self.passes.get(s.seq_id, 0) >= self.max_passes]
        rest = sorted((s for s in state.waiting if s not in aged), key=lambda s: s.num_prompt_tokens)
        add_prefill_chunks(decision, [*prefilling, *aged, *rest], budget, budget.num_free_blocks)
        scheduled = {id(item.seq) for item in decision.items}
        for seq in state.waiting:
            if id(seq) in scheduled:
                self.passes.pop(seq.seq_id, None)
            else:
                self.passes[seq.seq_id] = self.passes.get(seq.seq_id, 0) + 1
        if decision.items:
            return decision
        for seq in state.running:
            if len(decision.items) >= budget.max_num_seqs or decision.num_tokens >= budget.max_num_batched_tokens:
                break
            decision.add(seq, 1)
        return decision


TestOnTheFlyInt4 = bind(LinearMethodConformance, OnTheFlyInt4)
TestInt8TokenHeadCodec = bind(KVCodecConformance, Int8TokenHeadCodec)
TestChainedTupleCache = bind(PrefixCacheConformance, ChainedTupleCache)
TestLoopMoE = bind(MoEExecutorConformance, LoopMoE)
TestAgingShortestFirst = bind(SchedulerPolicyConformance, AgingShortestFirst)


def test_linear_method_without_a_scheme_is_told_what_to_add():
    legacy_tolerance.cache_clear()
    with pytest.warns(DeprecationWarning, match=r"no quant_scheme\(\).*add `def quant_scheme"):
        assert legacy_tolerance(OnTheFlyInt4) == OnTheFlyInt4.tolerance


def test_policy_counting_its_calls_is_told_what_to_add():
    with pytest.warns(DeprecationWarning, match=r"api_version = \"1.5\".*steps_waited.*state.retry"):
        assert strict_retries(AgingShortestFirst, None) is False


def test_cache_written_before_1_6_is_spared_its_rules_and_told_what_to_declare():
    with pytest.warns(DeprecationWarning, match=r"api_version = \"1.6\".*keeps_inserted_blocks"):
        assert holds_cache_rules(ChainedTupleCache, None) is False
    current = type("CurrentChainedTupleCache", (ChainedTupleCache,), {"api_version": "1.6"})
    assert holds_cache_rules(current, None) is True
