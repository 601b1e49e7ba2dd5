"""What the real Scheduler tells a policy since plugin API 1.5: the step being planned, whether a call re-asks the
same step (after a preemption or an admission that did not fit), and how long each sequence has gone without tokens."""
from __future__ import annotations

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.scheduler import Scheduler
from nanocore.engine.sequence import Sequence
from nanocore.interfaces import ScheduleDecision, SchedulerState
from nanocore.plugins import get_registry
from nanocore.runner.step_plan import StepOutput


class AdmitsRegardless:
    """Whole prompts and decodes in queue order within the token budget, ignoring free blocks (the core checks)."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        for seq in [*state.waiting, *state.running]:
            fits = decision.num_tokens + seq.num_uncomputed_tokens <= budget.max_num_batched_tokens
            if fits and len(decision.items) < budget.max_num_seqs:
                decision.add(seq, seq.num_uncomputed_tokens)
        return decision


class Recorder:
    """A policy (prefill_first by default), recording (step, retry, {seq_id: steps_waited}, waiting ids) of each call."""

    name = "recorder"

    def __init__(self, policy=None):
        self.policy = policy or get_registry().get("scheduler_policy", "prefill_first").cls({})
        self.calls = []

    def schedule(self, state, budget):
        waited = {s.seq_id: state.steps_waited(s) for s in (*state.waiting, *state.running)}
        self.calls.append((state.step, state.retry, waited, [s.seq_id for s in state.waiting]))
        return self.policy.schedule(state, budget)


def make_scheduler(num_blocks: int, max_tokens: int = 64, max_seqs: int = 4, block_size: int = 4, policy=None):
    recorder = Recorder(policy)
    cache = get_registry().get("prefix_cache", "none").cls(block_size, num_blocks)
    scheduler = Scheduler(recorder, BlockManager(num_blocks, block_size, cache), max_seqs, max_tokens, 1 << 20)
    return scheduler, recorder


def sequence(seq_id: int, prompt_len: int, max_tokens: int = 4) -> Sequence:
    return Sequence(seq_id, seq_id, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), max_tokens)


def run_step(scheduler: Scheduler):
    """One step through the scheduler's own plan / update, every sampling row sampling token 7, nothing stopping."""
    plan = scheduler.schedule()
    batch = scheduler.batch
    sampled = [row.seq_id for row in plan.rows if row.samples]
    scheduler.update(plan, StepOutput(sampled, [7] * len(sampled)), lambda seq: None)
    return batch


def test_steps_count_and_waits_grow_until_scheduled():
    scheduler, recorder = make_scheduler(num_blocks=64, max_tokens=8, max_seqs=1)
    first, second = sequence(0, 8), sequence(1, 8)
    scheduler.add(first)
    scheduler.add(second)
    run_step(scheduler)  # the whole budget goes to the first prompt
    run_step(scheduler)  # its decode: the second waits again
    scheduler.add(third := sequence(2, 3))
    run_step(scheduler)
    steps = [(step, retry) for step, retry, _, _ in recorder.calls]
    assert steps == [(0, False), (1, False), (2, False)], steps
    assert recorder.calls[0][2] == {0: 0, 1: 0}
    assert recorder.calls[1][2] == {0: 0, 1: 1}, "the first prompt ran at step 0; the second was passed over once"
    # prefill_first ran the second prompt at step 1, passing over the first one's decode
    assert recorder.calls[2][2] == {0: 1, 1: 0, third.seq_id: 0}, recorder.calls[2]


def test_a_re_ask_in_the_same_step_is_a_retry():
    # one sequence a step and one free block: the second prompt's admission does not fit, so the core asks again
    # with waiting hidden, and the first prompt decodes
    scheduler, recorder = make_scheduler(num_blocks=3, max_seqs=1, policy=AdmitsRegardless())
    scheduler.add(sequence(0, 7))
    run_step(scheduler)
    scheduler.add(sequence(1, 8))
    batch = run_step(scheduler)
    step_one = [(step, retry, waiting) for step, retry, _, waiting in recorder.calls if step == 1]
    assert step_one == [(1, False, [1]), (1, True, [])], step_one
    assert [seq.seq_id for seq in batch.seqs] == [0]


def test_finished_and_aborted_sequences_leave_the_wait_table():
    scheduler, _ = make_scheduler(num_blocks=64)
    running, waiting = sequence(0, 4), sequence(1, 4)
    scheduler.add(running)
    run_step(scheduler)
    scheduler.add(waiting)
    scheduler.finish(running)
    scheduler.abort(waiting)
    assert scheduler.waiting_since == {}


def test_a_state_built_without_the_new_fields_reads_as_no_wait():
    # a simulator written for 1.0 builds SchedulerState(waiting, running) positionally
    state = SchedulerState([sequence(0, 4)], [])
    assert (state.step, state.retry, state.steps_waited(state.waiting[0])) == (0, False, 0)
