"""decode_first specifics: decision shape, chunking, options; and mixed batches on the GPU."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from nanocore.interfaces import SchedulerState, StepBudget
from nanocore_conformance.scheduler_driver import engine_greedy_outputs, make_prompt
from nanocore_decode_first import DecodeFirstPolicy


@dataclass(eq=False)
class Seq:
    seq_id: int
    num_tokens: int
    num_computed_tokens: int = 0
    num_blocks: int = 0

    @property
    def arrival_index(self):
        return self.seq_id

    @property
    def num_prompt_tokens(self):
        return self.num_tokens

    @property
    def num_uncomputed_tokens(self):
        return self.num_tokens - self.num_computed_tokens


def decide(policy, waiting, running, tokens=64, seqs=8, free_blocks=1000, block_size=16):
    decision = policy.schedule(SchedulerState(waiting, running), StepBudget(tokens, seqs, free_blocks, block_size))
    return [(item.seq.seq_id, item.num_tokens) for item in decision.items]


def test_decodes_first_then_partial_prefill_then_new_prompts_in_arrival_order():
    decodes = [Seq(0, 40, 39, 3), Seq(1, 20, 19, 2)]
    partial = Seq(2, 500, 128, 8)
    assert decide(DecodeFirstPolicy({"chunk_size": 32}), [Seq(3, 10), Seq(4, 10)], [*decodes, partial]) == [
        (0, 1), (1, 1), (2, 32), (3, 10), (4, 10)]


def test_long_prompt_never_takes_the_decodes_budget():
    decodes = [Seq(i, 40, 39, 3) for i in range(5)]
    got = decide(DecodeFirstPolicy({"chunk_size": 0}), [Seq(9, 32768)], decodes, tokens=16)
    assert got == [(i, 1) for i in range(5)] + [(9, 11)]


def test_max_num_seqs_and_blocks_cap_prefill():
    decodes = [Seq(0, 40, 39, 3)]
    assert decide(DecodeFirstPolicy({}), [Seq(1, 100), Seq(2, 5)], decodes, seqs=2) == [(0, 1), (1, 64 - 1)]
    # the head prompt does not fit the free blocks: no overtaking by the small one behind it
    assert decide(DecodeFirstPolicy({}), [Seq(1, 100), Seq(2, 5)], decodes, free_blocks=2) == [(0, 1)]


@pytest.mark.parametrize("options, match", [({"chunk_size": -1}, ">= 0"), ({"chunk": 8}, "allowed options"),
                                            ({"chunk_size": "128"}, "must be int")])
def test_bad_options_say_what_to_do(options, match):
    with pytest.raises(ValueError, match=match):
        DecodeFirstPolicy(options)


@pytest.mark.cuda
def test_mixed_batches_on_cuda_match_prefill_first():
    arrivals = [(0, make_prompt(0, 300), 24), (2, make_prompt(1, 700), 8), (5, make_prompt(2, 9), 30)]
    oracle = engine_greedy_outputs("prefill_first", {}, arrivals, device="cuda", enforce_eager=True,
                                   num_kv_blocks=512)
    got = engine_greedy_outputs("decode_first", {"chunk_size": 64}, arrivals, device="cuda", num_kv_blocks=512,
                                max_num_batched_tokens=128, max_num_seqs=4)
    assert got == oracle
