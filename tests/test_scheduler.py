"""Scheduler mechanics on a tiny fake model: chunked prefill, preemption, rejection, bad policies."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import CharTokenizer, fake_loaded_model, greedy_full_recompute
from nanocore.engine.llm import LLM
from nanocore.runner.model_runner import ModelRunner
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.scheduler import PolicyError
from nanocore.interfaces import ScheduleDecision, SchedulerPolicy
from nanocore.plugins import get_registry

PROMPTS = ["hello world", "the quick brown fox jumps", "abc", "paged attention is neat", "x", "zzz top"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def make_llm(**fields):
    fields = {"device": "cpu", "block_size": 4, "num_kv_blocks": 256, "prefix_cache": "none",
              "scheduler_policy": "prefill_first", "kv_codec": "unquantized", **fields}
    return LLM("fake", loaded_model=fake_loaded_model(), **fields)


def token_outputs(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def reference(llm, prompts=PROMPTS, max_tokens=12):
    tok = CharTokenizer()
    return [greedy_full_recompute(llm.engine.loaded.model, tok.encode(p), max_tokens) for p in prompts]


def test_chunked_prefill_positions_are_contiguous(monkeypatch):
    llm = make_llm(max_num_batched_tokens=5)
    seen: dict[int, list[int]] = {}
    original = ModelRunner.prepare

    def recording_prepare(self, plan, all_logits=False):
        inputs = original(self, plan, all_logits)
        starts = inputs.meta.query_start_loc.tolist()
        for i, s in enumerate(plan.rows):
            seen.setdefault(s.seq_id, []).extend(inputs.positions[starts[i]:starts[i + 1]].tolist())
            slots = inputs.meta.slot_mapping[starts[i]:starts[i + 1]].tolist()
            pos = inputs.positions[starts[i]:starts[i + 1]].tolist()
            assert slots == [s.block_table[p // 4] * 4 + p % 4 for p in pos]
        return inputs

    monkeypatch.setattr(ModelRunner, "prepare", recording_prepare)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for positions in seen.values():
        assert positions == list(range(len(positions)))
    assert token_outputs(outputs) == reference(llm)


def test_preemption_under_tiny_kv_budget_matches_large_budget():
    large = make_llm(num_kv_blocks=256)
    expected = token_outputs(large.generate(PROMPTS, GREEDY, use_tqdm=False))
    tiny = make_llm(num_kv_blocks=10)  # one request needs up to 10 blocks of 4 tokens
    outputs = tiny.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert token_outputs(outputs) == expected == reference(large)
    assert tiny.stats().num_preemptions > 0
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    assert tiny.engine.block_manager.num_free_blocks == 10  # every block came back


def test_impossible_request_is_rejected_not_hung():
    llm = make_llm(num_kv_blocks=4)
    with pytest.raises(ValueError, match="whole KV cache has 4"):
        llm.generate("hello world", SamplingParams(max_tokens=16), use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate("a" * 520, SamplingParams(max_tokens=16), use_tqdm=False)  # prompt alone > 512
    assert not llm.engine.has_unfinished_requests()


class MixedPolicy(SchedulerPolicy):
    """Every step: a 3-token chunk of each prefilling sequence plus every decode, admitting all."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        for seq in [*state.running, *state.waiting]:
            decision.add(seq, min(3, seq.num_uncomputed_tokens))
        return decision


def test_mixed_prefill_and_decode_batches():
    llm = make_llm()
    llm.engine.scheduler.policy = MixedPolicy()
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert token_outputs(outputs) == reference(llm)


class BadPolicy(SchedulerPolicy):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def schedule(self, state, budget):
        seqs = [*state.running, *state.waiting]
        decision = ScheduleDecision()
        if self.how == "twice":
            decision.add(seqs[0], 1)
            decision.add(seqs[0], 1)
        elif self.how == "zero":
            decision.add(seqs[0], 0)
        elif self.how == "too_many":
            decision.add(seqs[0], seqs[0].num_uncomputed_tokens + 1)
        elif self.how == "over_budget":
            for s in seqs:
                decision.add(s, s.num_uncomputed_tokens)
        elif self.how == "stranger":
            decision.add(object(), 1)
        return decision


@pytest.mark.parametrize("how, message", [
    ("twice", "scheduled twice"), ("zero", "allowed 1.."), ("too_many", "allowed 1.."),
    ("over_budget", "exceed max_num_batched_tokens"), ("stranger", "neither waiting nor running"),
    ("empty", "scheduled nothing"),
])
def test_invalid_policy_decision_is_a_clear_error(how, message):
    llm = make_llm(max_num_batched_tokens=8)
    policy = BadPolicy(how)
    policy.name = "bad_policy"
    llm.engine.scheduler.policy, llm.engine.scheduler.policy_name = policy, "bad_policy"
    with pytest.raises(PolicyError, match=rf"'bad_policy'.*{message}"):
        llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # aborted, engine usable again


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_prefix_cache_hits_reduce_work_and_keep_outputs(cache):
    if cache not in get_registry().names("prefix_cache"):
        pytest.skip(f"prefix cache plugin {cache!r} is not installed")
    shared = "the quick brown fox jumps over"
    prompts = [shared + " a dog", shared + " a cat"]
    llm = make_llm(prefix_cache=cache)
    first = llm.generate(prompts[0], GREEDY, use_tqdm=False)[0]
    second = llm.generate(prompts[1], GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (len(shared) + 2) // 4 * 4
    assert token_outputs([first, second]) == reference(llm, prompts)
    again = llm.generate(prompts, GREEDY, use_tqdm=False)  # full-prompt hits recompute the last token
    assert token_outputs(again) == token_outputs([first, second])
    assert llm.stats().num_cached_tokens > 0


def test_preemption_with_prefix_cache_and_chunking():
    if "hash" not in get_registry().names("prefix_cache"):
        pytest.skip("prefix cache plugin 'hash' is not installed")
    llm = make_llm(num_kv_blocks=12, prefix_cache="hash", max_num_batched_tokens=6)
    prompts = [p + " and more" for p in PROMPTS]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_outputs(outputs) == reference(llm, prompts)
    assert llm.stats().num_preemptions > 0


def test_output_past_max_model_len_stops_with_length_like_vllm():
    llm = make_llm(max_model_len=40)
    prompt = list(range(3, 33))  # 30 tokens: room for 10 more
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 10 and out[0].outputs[0].finish_reason == "length"
