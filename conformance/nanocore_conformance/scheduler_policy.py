"""SchedulerPolicyConformance: simulated runs over random arrival streams, checking the invariants.

The simulator plays the core: it admits arrivals, asks the policy, validates every decision (token
budget, ``max_num_seqs``, known sequences at most once, ``1 <= tokens <= uncomputed``, blocks), then
computes the tokens and samples one token per finished prefill or decode. The block pool holds every
sequence at full length, so no preemption is ever needed and the run must make progress.
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from nanocore.interfaces import SchedulerState, StepBudget
from nanocore_conformance.base import suite_settings
from nanocore_conformance.contract import BackendContractConformance


@dataclass(eq=False)
class FakeSequence:
    """Satisfies ``nanocore.interfaces.SequenceView``."""

    seq_id: int
    arrival_index: int
    num_prompt_tokens: int
    num_tokens: int
    num_computed_tokens: int
    num_blocks: int
    max_output_tokens: int

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.num_tokens - self.num_prompt_tokens >= self.max_output_tokens


def check_decision(decision, state, budget) -> None:
    known = {id(s) for s in (*state.waiting, *state.running)}
    seen, blocks = set(), 0
    for item in decision.items:
        seq = item.seq
        assert id(seq) in known, f"decision schedules sequence {getattr(seq, 'seq_id', seq)!r}, which was not given"
        assert id(seq) not in seen, f"decision schedules sequence {seq.seq_id} twice"
        seen.add(id(seq))
        assert 1 <= item.num_tokens <= seq.num_uncomputed_tokens, (
            f"sequence {seq.seq_id} scheduled for {item.num_tokens} tokens; it has {seq.num_uncomputed_tokens} uncomputed")
        blocks += budget.blocks_needed(seq, item.num_tokens)
    assert decision.num_tokens <= budget.max_num_batched_tokens, (
        f"decision has {decision.num_tokens} tokens; max_num_batched_tokens is {budget.max_num_batched_tokens}")
    assert len(decision.items) <= budget.max_num_seqs, (
        f"decision has {len(decision.items)} sequences; max_num_seqs is {budget.max_num_seqs}")
    assert blocks <= budget.num_free_blocks, f"decision needs {blocks} new blocks; only {budget.num_free_blocks} are free"


def simulate(policy, arrivals, max_num_batched_tokens, max_num_seqs, block_size) -> int:
    """Run ``arrivals`` [(step, prompt_len, output_len)] to completion; return the number of steps."""
    sequences = [FakeSequence(i, i, p, p, 0, 0, o) for i, (_, p, o) in enumerate(arrivals)]
    num_free_blocks = sum(-(-(s.num_prompt_tokens + s.max_output_tokens) // block_size) for s in sequences)
    waiting, running, step = [], [], 0
    max_steps = sum(p + o for _, p, o in arrivals) + max(a for a, _, _ in arrivals) + 1
    while any(not s.finished for s in sequences):
        assert step <= max_steps, f"no progress after {step} steps (waiting {len(waiting)}, running {len(running)})"
        waiting += [s for s, (arrive, _, _) in zip(sequences, arrivals) if arrive == step]
        step += 1
        if not waiting and not running:
            continue
        state = SchedulerState(waiting=tuple(waiting), running=tuple(running))
        budget = StepBudget(max_num_batched_tokens, max_num_seqs, num_free_blocks, block_size)
        decision = policy.schedule(state, budget)
        check_decision(decision, state, budget)
        assert decision.items, (
            f"empty decision at step {step} although everything fits (free blocks {num_free_blocks}, "
            f"waiting {[s.num_uncomputed_tokens for s in waiting]}, running {[s.num_uncomputed_tokens for s in running]})")
        for item in decision.items:
            seq = item.seq
            new_blocks = budget.blocks_needed(seq, item.num_tokens)
            seq.num_blocks += new_blocks
            num_free_blocks -= new_blocks
            seq.num_computed_tokens += item.num_tokens
            if seq in waiting:
                waiting.remove(seq)
                running.append(seq)
            if seq.num_uncomputed_tokens == 0:
                seq.num_tokens += 1  # sampled a token
                if seq.finished:
                    running.remove(seq)
                    num_free_blocks += seq.num_blocks
                    seq.num_blocks = 0
    return step


class SchedulerPolicyConformance(BackendContractConformance):
    kind = "scheduler_policy"

    @suite_settings
    @given(
        budget=st.tuples(st.integers(1, 64), st.integers(1, 8), st.sampled_from([1, 4, 16])),
        data=st.data(),
    )
    def test_simulated_run_keeps_invariants_and_finishes(self, backend_cls, backend_options, budget, data):
        max_tokens, max_seqs, block_size = budget
        arrivals = data.draw(st.lists(
            st.tuples(st.integers(0, 6), st.integers(1, max_tokens), st.integers(1, 6)), min_size=1, max_size=10))
        simulate(backend_cls(backend_options), arrivals, max_tokens, max_seqs, block_size)

    def test_prompts_filling_the_budget_one_at_a_time(self, backend_cls, backend_options):
        # every prompt fills the whole token budget and only one sequence fits a step
        simulate(backend_cls(backend_options), [(0, 8, 2)] * 4, 8, 1, 4)

    def test_empty_state_gives_empty_decision(self, backend_cls, backend_options):
        decision = backend_cls(backend_options).schedule(SchedulerState((), ()), StepBudget(16, 4, 10, 4))
        assert not decision.items, "with nothing waiting or running the decision must be empty"
