"""SchedulerPolicyConformance: simulated runs over random arrival streams, checking the invariants.

The simulator (``scheduler_sim``) plays the core: every decision is valid, leaves its input unchanged and
is the same when asked twice, the run finishes, and every request gets its first tokens within a bound
derived from the work that arrived before it (however the policy orders its work). Fixed states check the
same per decision, deterministically.

Deeper checks drive the policy through the engine's real Scheduler and BlockManager with a small KV
budget and a fake model (``scheduler_driver``), and through a real LLMEngine on a tiny random model,
whose greedy outputs must equal ``prefill_first``'s.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanocore.interfaces import SchedulerState, StepBudget
from nanocore_conformance.base import suite_settings
from nanocore_conformance.compat import targeted_minor, warn_legacy
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.scheduler_driver import ABORT_PHASES as DRIVER_ABORT_PHASES
from nanocore_conformance.scheduler_driver import (
    SchedulerDriver,
    check_arrival_order,
    engine_greedy_outputs,
    expected_outputs,
    make_prompt,
    registered,
)
from nanocore_conformance.scheduler_order import check_step_order, decodes_among_prefills_state
from nanocore_conformance.scheduler_sim import ABORT_PHASES as SIM_ABORT_PHASES
from nanocore_conformance.scheduler_sim import FakeSequence, decide_twice, simulate


def fixed_state(decodes_only: bool = False) -> SchedulerState:
    """Three decoding sequences, one half-prefilled prompt and two waiting prompts (block size 16)."""
    running = [FakeSequence(0, 0, 30, 41, 40, 3, 20), FakeSequence(1, 1, 12, 21, 20, 2, 20),
               FakeSequence(2, 2, 29, 30, 29, 2, 20)]
    if decodes_only:
        return SchedulerState(waiting=[], running=running)
    running.append(FakeSequence(3, 3, 50, 50, 32, 2, 5))
    return SchedulerState(waiting=[FakeSequence(4, 4, 9, 9, 0, 0, 5), FakeSequence(5, 5, 30, 30, 0, 0, 5)],
                          running=running)


def scarce_blocks_state() -> SchedulerState:
    """Two decoding sequences at a block boundary (each needs a new block for its next token) and a waiting 16-token
    prompt (four blocks), block size 4: with few free blocks, decodes and prefill chunks compete for them."""
    running = [FakeSequence(0, 0, 6, 9, 8, 2, 5), FakeSequence(1, 1, 3, 5, 4, 1, 5)]
    return SchedulerState(waiting=[FakeSequence(2, 2, 16, 16, 0, 0, 4)], running=running)


#: Arrivals for the abort checks: a long prompt that needs several chunks, short ones, later arrivals.
ABORT_ARRIVALS = [(0, 40, 6), (0, 12, 6), (1, 30, 4), (2, 5, 3), (3, 20, 5), (5, 9, 4)]


def greedy_arrivals() -> list[tuple[int, list[int], int]]:
    return [(0, make_prompt(0, 37), 12), (0, make_prompt(1, 5), 20), (3, make_prompt(2, 60), 6),
            (4, make_prompt(3, 1), 9), (10, make_prompt(4, 23), 15)]


@functools.cache
def greedy_reference_outputs() -> list[list[int]]:
    """prefill_first's greedy outputs of ``greedy_arrivals`` with room for everything (computed once)."""
    return engine_greedy_outputs("prefill_first", {}, greedy_arrivals(), block_size=16, num_kv_blocks=64)


def strict_retries(backend_cls, backend_entry) -> bool:
    """Whether a re-asked step must get the same decision: a rule of API 1.1; a 1.0 policy is told retries apart
    instead (it may count calls) and warned how to move on."""
    if targeted_minor(backend_cls, backend_entry) >= (1, 1):
        return True
    warn_legacy(backend_cls, "written for plugin API 1.0, whose policies may decide differently when re-asked in one "
                "step; declare api_version = \"1.5\", age from state.steps_waited(seq) and advance counters of "
                "your own only when state.retry is False")
    return False


class SchedulerPolicyConformance(BackendContractConformance):
    kind = "scheduler_policy"
    #: The starvation bound a policy declares: "arrival" = no request gets its first tokens before an earlier
    #: arrival, so a request waits only for earlier ones (each of which finishes); None = no promise.
    admission_order: str | None = "arrival"
    #: The step order a policy declares (``scheduler_order``): "prefills_first", "decodes_first" or None (no promise).
    step_order: str | None = None
    requirement_names = ("admission_order", "step_order")

    @pytest.fixture
    def strict_retries(self, backend_cls, backend_entry) -> bool:
        return strict_retries(backend_cls, backend_entry)

    @suite_settings
    @given(
        budget=st.tuples(st.integers(1, 64), st.integers(1, 8), st.sampled_from([1, 4, 16])),
        data=st.data(),
    )
    def test_simulated_run_keeps_invariants_and_finishes(self, backend_cls, backend_options, strict_retries, budget,
                                                         data):
        max_tokens, max_seqs, block_size = budget
        arrivals = data.draw(st.lists(
            st.tuples(st.integers(0, 6), st.integers(1, max_tokens), st.integers(1, 6)), min_size=1, max_size=10))
        simulate(backend_cls(backend_options), arrivals, max_tokens, max_seqs, block_size, strict_retries)

    def test_prompts_filling_the_budget_one_at_a_time(self, backend_cls, backend_options, strict_retries):
        # every prompt fills the whole token budget and only one sequence fits a step
        simulate(backend_cls(backend_options), [(0, 8, 2)] * 4, 8, 1, 4, strict_retries)

    @pytest.mark.parametrize("decodes_only, budget", [
        (False, (24, 3)), (False, (64, 2)), (False, (64, 8)), (False, (16, 8)), (False, (16, 2)),
        (True, (64, 8)), (True, (2, 8)), (True, (64, 2))])
    def test_fixed_state_decision_is_valid_pure_and_repeatable(self, backend_cls, backend_options, strict_retries,
                                                              decodes_only, budget):
        decision = decide_twice(backend_cls(backend_options), fixed_state(decodes_only), StepBudget(*budget, 100, 16),
                                strict_retries)
        assert decision.items, "every sequence fits the free blocks, so the decision must not be empty"

    @pytest.mark.parametrize("free_blocks", [2, 3, 5, 6])
    def test_decision_fits_scarce_free_blocks(self, backend_cls, backend_options, strict_retries, free_blocks):
        # the blocks the decodes' next tokens need count too: a prefill chunk may take only what they leave
        decide_twice(backend_cls(backend_options), scarce_blocks_state(), StepBudget(64, 8, free_blocks, 4),
                     strict_retries)

    @pytest.mark.parametrize("state, budget", [
        (fixed_state, (24, 3, 100, 16)), (fixed_state, (64, 2, 100, 16)), (fixed_state, (64, 8, 100, 16)),
        (fixed_state, (16, 2, 100, 16)), (fixed_state, (4, 8, 100, 16)), (fixed_state, (64, 8, 3, 16)),
        (functools.partial(fixed_state, True), (64, 8, 100, 16)),
        (functools.partial(fixed_state, True), (2, 8, 100, 16)),
        (decodes_among_prefills_state, (64, 8, 1, 4)), (decodes_among_prefills_state, (64, 8, 2, 4)),
        (decodes_among_prefills_state, (64, 8, 3, 4)), (decodes_among_prefills_state, (64, 8, 10, 4)),
        (decodes_among_prefills_state, (3, 8, 10, 4)), (decodes_among_prefills_state, (64, 2, 10, 4)),
        (decodes_among_prefills_state, (64, 3, 10, 4))], ids=lambda x: getattr(x, "__name__", None))
    def test_declared_step_order(self, backend_cls, backend_options, strict_retries, state, budget):
        # prefills before admissions, decodes before or after prefill chunks, as conformance_requirements declares
        if self.step_order is None:
            pytest.skip("the policy declares no step_order in conformance_requirements")
        state, budget = state(), StepBudget(*budget)
        decision = decide_twice(backend_cls(backend_options), state, budget, strict_retries)
        check_step_order(self.step_order, state, budget, decision)

    def test_long_prompt_is_not_starved_by_a_stream_of_short_ones(self, backend_cls, backend_options, strict_retries):
        # four 4-token prompts arrive every step, enough to fill the budget alone, behind one long prompt
        arrivals = [(0, 40, 2)] + [(step, 4, 1) for step in range(48) for _ in range(4)]
        simulate(backend_cls(backend_options), arrivals, 16, 4, 16, strict_retries)

    @pytest.mark.parametrize("budget", [(8, 2), (16, 4)])
    def test_aborted_sequences_are_never_scheduled_again(self, backend_cls, backend_options, strict_retries, budget):
        # a 40-token prompt is prefilled in chunks; one sequence is aborted waiting, one mid-prefill, one mid-decode
        simulate(backend_cls(backend_options), ABORT_ARRIVALS, *budget, 4, strict_retries, tuple(SIM_ABORT_PHASES))

    def test_real_scheduler_aborts_at_every_phase(self, backend_cls, backend_options):
        # as above through the real Scheduler, with a forced preemption so a preempted sequence is aborted too
        driver = SchedulerDriver(backend_cls(backend_options), 8, 2, 4, 32)
        result = driver.run(ABORT_ARRIVALS, frozenset({4}), tuple(DRIVER_ABORT_PHASES))
        gone = {seq_id for seq_id, how in driver.checker.gone.values() if how.startswith("aborted")}
        for i, (_, p, o) in enumerate(ABORT_ARRIVALS):
            if i not in gone:
                assert result.outputs[i] == expected_outputs(make_prompt(i, p), o), (
                    f"request {i} produced other tokens than an unscheduled run after others were aborted")

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

    def test_greedy_outputs_match_prefill_first_on_a_tiny_model(self, backend_entry, backend_cls, backend_options):
        # staggered arrivals, a small token budget and a KV cache that forces preemption
        arrivals = greedy_arrivals()
        oracle = greedy_reference_outputs()
        with registered(self.kind, backend_cls) if backend_entry is None else nullcontext(self.backend) as name:
            got = engine_greedy_outputs(name, backend_options, arrivals, block_size=4, num_kv_blocks=26,
                                        max_num_batched_tokens=24, max_num_seqs=3)
        for i, (want, have) in enumerate(zip(oracle, got)):
            assert have == want, f"request {i}: greedy tokens {have} differ from prefill_first's {want}"
