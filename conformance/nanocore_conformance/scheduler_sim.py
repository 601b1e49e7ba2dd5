"""A simulated core for scheduler policies: fake sequences, decision checks and a run to completion.

The simulator plays the core: it admits arrivals, asks the policy (twice, as the core's look-ahead and
retries may), validates every decision (token budget, ``max_num_seqs``, known sequences at most once,
``1 <= tokens <= uncomputed``, blocks), then computes the tokens and samples one token per finished prefill
or decode. The block pool holds every sequence at full length, so no preemption is ever needed, the run
must make progress and no request may wait longer than its bound (``wait_bound``).
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from types import MappingProxyType

from nanocore.interfaces import SchedulerState, StepBudget


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
    #: Why it left the queues before finishing ("aborted mid-prefill at step 3"), or None.
    gone: str | None = None

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.gone is not None or self.num_tokens - self.num_prompt_tokens >= self.max_output_tokens

    @property
    def remaining_work(self) -> int:
        """Tokens it may still compute (its prompt and outputs, less what is computed)."""
        return self.num_prompt_tokens + self.max_output_tokens - self.num_computed_tokens


def check_decision(decision, state, budget) -> None:
    known = {id(s) for s in (*state.waiting, *state.running)}
    seen, blocks = set(), 0
    for item in decision.items:
        seq = item.seq
        if id(seq) not in known and getattr(seq, "gone", None):
            raise AssertionError(
                f"policy scheduled sequence {seq.seq_id}, which was {seq.gone}; a decision names only sequences in "
                f"state.waiting or state.running now: forget a sequence once it leaves them (abort, finish)")
        assert id(seq) in known, f"decision schedules sequence {getattr(seq, 'seq_id', seq)!r}, which was not given"
        assert id(seq) not in seen, f"decision schedules sequence {seq.seq_id} twice; list each sequence once"
        seen.add(id(seq))
        assert 1 <= item.num_tokens <= seq.num_uncomputed_tokens, (
            f"sequence {seq.seq_id} scheduled for {item.num_tokens} tokens; it has {seq.num_uncomputed_tokens} "
            f"uncomputed (schedule between 1 and num_uncomputed_tokens, or leave the sequence out)")
        blocks += budget.blocks_needed(seq, item.num_tokens)
    total = sum(item.num_tokens for item in decision.items)
    assert total <= budget.max_num_batched_tokens, (
        f"decision has {total} tokens; max_num_batched_tokens is {budget.max_num_batched_tokens}")
    assert len(decision.items) <= budget.max_num_seqs, (
        f"decision has {len(decision.items)} sequences; max_num_seqs is {budget.max_num_seqs}")
    assert blocks <= budget.num_free_blocks, f"decision needs {blocks} new blocks; only {budget.num_free_blocks} are free"


def snapshot(state: SchedulerState) -> tuple:
    """What a policy must leave unchanged: the queues and every field a policy may read of a sequence."""
    fields = [(s.seq_id, s.arrival_index, s.num_prompt_tokens, s.num_tokens, s.num_computed_tokens, s.num_blocks)
              for s in (*state.waiting, *state.running)]
    return [id(s) for s in state.waiting], [id(s) for s in state.running], fields


def described(decision) -> list[tuple[int, int]]:
    return [(item.seq.seq_id, item.num_tokens) for item in decision.items]


def decide_twice(policy, state: SchedulerState, budget: StepBudget, strict: bool = True):
    """The decision, checked to be valid and to leave state and budget as they were; then the core's re-ask of the
    same step (``retry`` True), which must decide the same (``strict``: API 1.1 on). A 1.0 policy's re-ask is only
    validated; its decision is the one run, as the core runs the last answer."""
    before, budget_before = snapshot(state), astuple(budget)
    decision = policy.schedule(state, budget)
    first = [(id(item.seq), item.num_tokens) for item in decision.items]
    assert snapshot(state) == before and astuple(budget) == budget_before, (
        "schedule() changed the state or budget it was given (a queue, or a sequence's fields); a policy only "
        "decides: the core admits, allocates and advances sequences")
    check_decision(decision, state, budget)
    retry = replace(state, retry=True)
    again = policy.schedule(retry, budget)
    assert snapshot(state) == before, "the second schedule() call changed the state it was given"
    assert [(id(item.seq), item.num_tokens) for item in decision.items] == first, (
        "the second schedule() call changed the first call's decision; return a new ScheduleDecision each call")
    if not strict:
        check_decision(again, retry, budget)
        return again
    assert [(id(item.seq), item.num_tokens) for item in again.items] == first, (
        f"asked twice with the same state and budget, schedule() decided {described(decision)} then "
        f"{described(again)} ([(seq_id, tokens)]; the second ask had state.retry True); the core may ask several "
        f"times per step (retries after preemption or a failed admission), so a decision must depend on the state "
        f"and budget only: age from state.steps_waited(seq), and advance counters of your own only when "
        f"state.retry is False")
    return decision


def wait_bound(ahead: list[FakeSequence], budget: StepBudget) -> int:
    """Schedule calls a new arrival may wait for its first tokens: one per token of work that arrived before
    it (each call must advance something, and a policy that does not overtake advances only that work), plus
    ``max_num_batched_tokens`` calls of slack for a policy that overtakes a little."""
    return 1 + sum(s.remaining_work for s in ahead) + budget.max_num_batched_tokens


#: Where a sequence may be when it is aborted (or finishes early, e.g. on a stop string).
ABORT_PHASES = {
    "waiting": lambda seq, running: not running and seq.num_computed_tokens == 0,
    "mid-prefill": lambda seq, running: running and 0 < seq.num_computed_tokens < seq.num_prompt_tokens,
    "mid-decode": lambda seq, running: running and seq.num_tokens > seq.num_prompt_tokens,
}


def abort_first(phase: str, waiting: list, running: list, step: int) -> int:
    """Abort the first sequence in ``phase`` (removed from its queue, as the core does); returns blocks freed."""
    for queue, is_running in ((running, True), (waiting, False)):
        for seq in queue:
            if ABORT_PHASES[phase](seq, is_running):
                queue.remove(seq)
                seq.gone = f"aborted {phase} at step {step}"
                freed, seq.num_blocks = seq.num_blocks, 0
                return freed
    return 0


def simulate(policy, arrivals, max_num_batched_tokens, max_num_seqs, block_size, strict: bool = True,
             aborts: tuple[str, ...] = ()) -> int:
    """Run ``arrivals`` [(step, prompt_len, output_len)] to completion; return the number of steps. Each phase in
    ``aborts`` aborts one sequence, the first time one is in it."""
    pending = list(aborts)
    sequences = [FakeSequence(i, i, p, p, 0, 0, o) for i, (_, p, o) in enumerate(arrivals)]
    num_free_blocks = sum(-(-(s.num_prompt_tokens + s.max_output_tokens) // block_size) for s in sequences)
    waiting, running, step = [], [], 0
    deadline: dict[int, int] = {}  # seq id -> last step it may get its first tokens
    since: dict[int, int] = {}  # seq id -> first step of its current wait (the state's waiting_since)
    max_steps = sum(p + o for _, p, o in arrivals) + max(a for a, _, _ in arrivals) + 1
    while any(not s.finished for s in sequences):
        assert step <= max_steps, f"no progress after {step} steps (waiting {len(waiting)}, running {len(running)})"
        budget = StepBudget(max_num_batched_tokens, max_num_seqs, num_free_blocks, block_size)
        for seq, (arrive, _, _) in zip(sequences, arrivals):
            if arrive == step:
                deadline[seq.seq_id] = step + wait_bound([*waiting, *running], budget)
                since[seq.seq_id] = step
                waiting.append(seq)
        step += 1
        for phase in list(pending) if step > 2 else ():  # once a few decisions have run
            before = len(waiting) + len(running)
            num_free_blocks += abort_first(phase, waiting, running, step - 1)
            if len(waiting) + len(running) < before:
                pending.remove(phase)
        if not waiting and not running:
            continue
        state = SchedulerState(list(waiting), list(running), step - 1, False, MappingProxyType(dict(since)))
        decision = decide_twice(policy, state, budget, strict)
        assert decision.items, (
            f"empty decision at step {step} although everything fits (free blocks {num_free_blocks}, "
            f"waiting {[s.num_uncomputed_tokens for s in waiting]}, running {[s.num_uncomputed_tokens for s in running]})")
        for item in decision.items:
            seq = item.seq
            since[seq.seq_id] = step
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
        check_waits(waiting, deadline, step, arrivals)
    assert not pending, f"the run never had a sequence to abort {pending} (the suite's arrivals must reach them)"
    return step


def check_waits(waiting: list[FakeSequence], deadline: dict[int, int], step: int, arrivals) -> None:
    for seq in waiting:
        assert step < deadline[seq.seq_id], (
            f"request {seq.seq_id} (arrived at step {arrivals[seq.seq_id][0]}, prompt {seq.num_prompt_tokens} tokens) "
            f"still waits at step {step}, past its bound of {deadline[seq.seq_id] - arrivals[seq.seq_id][0]} steps "
            f"(one per token of work that arrived before it, plus max_num_batched_tokens): a policy may overtake, "
            f"but it must not starve a request while later ones keep arriving")
