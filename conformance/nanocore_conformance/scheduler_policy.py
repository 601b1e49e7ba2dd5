"""SchedulerPolicyConformance: simulated runs over random arrival streams, checking the invariants.

The simulator plays the core: it admits arrivals, asks the policy, validates every decision (token
budget, ``max_num_seqs``, known sequences at most once, ``1 <= tokens <= uncomputed``, blocks), then
computes the tokens and samples one token per finished prefill or decode. The block pool holds every
sequence at full length, so no preemption is ever needed and the run must make progress.

Deeper checks drive the policy through the engine's real Scheduler and BlockManager with a small KV
budget and a fake model (``scheduler_driver``), and through a real LLMEngine on a tiny random model,
whose greedy outputs must equal ``prefill_first``'s.
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from nanocore.interfaces import SchedulerState, StepBudget
from nanocore_conformance.base import suite_settings
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.scheduler_driver import (
    SchedulerDriver, check_arrival_order, engine_greedy_outputs, expected_outputs, make_prompt)


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
    #: The starvation bound a policy declares: "arrival" = no request gets its first tokens before an earlier
    #: arrival, so a request waits only for earlier ones (each of which finishes); None = no promise.
    admission_order: str | None = "arrival"

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

    @suite_settings
    @given(data=st.data())
    def test_real_scheduler_small_kv_finishes_and_restores(self, backend_cls, backend_options, data):
        block_size = data.draw(st.sampled_from([1, 2, 4, 8]), "block_size")
        max_tokens, max_seqs = data.draw(st.integers(1, 48), "max_num_batched_tokens"), data.draw(st.integers(1, 6))
        arrivals = data.draw(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 40), st.integers(1, 12)),
                                      min_size=1, max_size=8), "arrivals")
        largest = max(-(-(p + o) // block_size) for _, p, o in arrivals)
        num_blocks = largest + data.draw(st.integers(0, largest), "spare_blocks")  # small: preemption is common
        preempt_at = frozenset(data.draw(st.lists(st.integers(1, 30), max_size=3), "forced_preemptions"))
        driver = SchedulerDriver(backend_cls(backend_options), max_tokens, max_seqs, block_size, num_blocks)
        result = driver.run(arrivals, preempt_at)
        for i, (_, p, o) in enumerate(arrivals):
            assert result.outputs[i] == expected_outputs(make_prompt(i, p), o), (
                f"request {i} produced other tokens than an unscheduled run: wrong positions or KV after preemption")
        if self.admission_order == "arrival":
            check_arrival_order(arrivals, result.first_admitted)

    def test_real_scheduler_preempts_under_kv_pressure(self, backend_cls, backend_options):
        # three requests that each need 5 of the 7 blocks: preemption or serialisation, never a crash
        arrivals = [(0, 12, 8), (0, 12, 8), (1, 12, 8)]
        result = SchedulerDriver(backend_cls(backend_options), 16, 3, 4, 7).run(arrivals, frozenset({12}))
        assert result.outputs == {i: expected_outputs(make_prompt(i, p), o) for i, (_, p, o) in enumerate(arrivals)}

    def test_greedy_outputs_match_prefill_first_on_a_tiny_model(self, backend_cls, backend_options):
        # staggered arrivals, a small token budget and a KV cache that forces preemption
        arrivals = [(0, make_prompt(0, 37), 12), (0, make_prompt(1, 5), 20), (3, make_prompt(2, 60), 6),
                    (4, make_prompt(3, 1), 9), (10, make_prompt(4, 23), 15)]
        oracle = engine_greedy_outputs("prefill_first", {}, arrivals, block_size=16, num_kv_blocks=64)
        got = engine_greedy_outputs(self.backend, backend_options, arrivals, block_size=4, num_kv_blocks=26,
                                    max_num_batched_tokens=24, max_num_seqs=3)
        for i, (want, have) in enumerate(zip(oracle, got)):
            assert have == want, f"request {i}: greedy tokens {have} differ from prefill_first's {want}"
