"""The scheduler: the one owner of sequence state. It runs the policy, validates its decision, admits,
allocates, preempts, plans each step for the runner, applies its output and frees finished sequences.

The policy (a plugin) only decides. Everything that keeps the engine correct happens here: a bad decision is
a clear error naming the policy, prefix-cache hits shrink the work of new sequences, and KV exhaustion preempts
the latest-arrived running sequence (recomputed later) instead of crashing. ``schedule()`` returns a
``StepPlan`` (plain data); ``update(plan, output, stop_of)`` appends the sampled tokens and applies stops.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Iterator

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.lookahead import Lookahead, lookahead_rows, plan_lookahead
from nanocore.engine.prompt_scoring import (
    cached_token_limit,
    ends_after_prefill,
    scheduled_row,
)
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.schedule_checks import PolicyError, check_fits, validate_decision
from nanocore.engine.sequence import Sequence, SequenceStatus
from nanocore.interfaces import ScheduleDecision, SchedulerPolicy, SchedulerState, StepBudget
from nanocore.runner.step_plan import AheadPlan, ScheduledRow, StepOutput, StepPlan

__all__ = ["PolicyError", "ScheduledBatch", "Scheduler"]

#: what ends a sequence after its newest token: (finish reason, stop reason), or None to go on
StopCheck = Callable[[Sequence], "tuple[str, int | str | None] | None"]


@dataclass
class ScheduledBatch:
    """One step's work: ``num_tokens[i]`` new tokens of ``seqs[i]``, starting at its computed tokens."""

    seqs: list[Sequence]
    num_tokens: list[int]

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)


class Scheduler:
    def __init__(self, policy: SchedulerPolicy, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int):
        self.policy = policy
        self.policy_name = policy.name or type(policy).__name__
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.batch = ScheduledBatch([], [])  # the sequences of the latest plan
        self.plan: StepPlan | None = None  # the latest plan: update() applies only its output
        self.lookahead: Lookahead | None = None
        self._finished_ids: list[int] = []  # since the latest plan: the runner drops their state
        self._reset_ids: list[int] = []  # since the latest plan: block tables freed or cut back
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first admission
        self.num_overlapped_steps = 0  # plans whose forward a look-ahead already ran
        self.num_discarded_lookaheads = 0
        self.peak_running = 0  # most sequences running at once (benchmarks reset it)
        self.num_steps = 0  # steps planned so far: the policy's ``state.step``
        self.waiting_since: dict[int, int] = {}  # seq id -> first step of its current wait (``state.steps_waited``)

    # ---- admission -----------------------------------------------------------------------
    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        check_fits(num_prompt_tokens, max_tokens, self.max_model_len, self.block_manager)

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq.num_prompt_tokens, seq.max_tokens)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.waiting_since[seq.seq_id] = self.num_steps

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Decide, validate, allocate and plan one step. Preempts (and asks the policy again) when KV runs out."""
        if self.lookahead is not None and self.waiting:  # admissions see the synchronous engine's free blocks
            self._reset_ids += self.lookahead.undo_blocks(self.block_manager)
            self.discard_lookahead()
        hide_waiting = False  # set when admissions did not fit: ask the policy for running work only
        since, retry = MappingProxyType(self.waiting_since), False
        while True:
            budget = StepBudget(self.max_num_batched_tokens, self.max_num_seqs,
                                self.block_manager.num_free_blocks, self.block_manager.block_size)
            waiting = [] if hide_waiting else list(self.waiting)
            state = SchedulerState(waiting, list(self.running), self.num_steps, retry, since)
            decision, retry = self.policy.schedule(state, budget), True
            validate_decision(decision, budget, waiting, self.running, self.policy_name)
            preempted_before = self.num_preemptions
            batch, admission_failed = self._apply(decision)
            if batch.seqs:
                self.num_steps += 1
                self.waiting_since.update((seq.seq_id, self.num_steps) for seq in batch.seqs)
                return self._plan(batch)
            if self.num_preemptions > preempted_before:
                continue
            if admission_failed and self.running and not hide_waiting:
                hide_waiting = True
                continue
            if self.preempt_latest() is None:
                raise PolicyError(
                    f"scheduler policy {self.policy_name!r} scheduled nothing for {len(self.waiting)} waiting "
                    f"sequence(s) although the whole KV cache ({self.block_manager.num_free_blocks} blocks) is "
                    f"available; the policy must schedule at least one sequence when nothing is running")
            hide_waiting = False

    def _apply(self, decision: ScheduleDecision) -> tuple[ScheduledBatch, bool]:
        """Admit and allocate in decision order. A running sequence that does not fit preempts later
        arrivals (or itself, ending the batch); an admission that does not fit is undone and closes
        admissions for this step. Returns the batch and whether an admission failed."""
        batch = ScheduledBatch([], [])
        # statuses as decided (validated: waiting or running), before this loop preempts anything: O(items)
        was_waiting = [item.seq.status is SequenceStatus.WAITING for item in decision.items]
        admission_failed = False
        block_size = self.block_manager.block_size
        for item, admission in zip(decision.items, was_waiting):
            seq = item.seq
            if admission:
                if seq.status is not SequenceStatus.WAITING or admission_failed:
                    continue  # preempted earlier in this step / keep the waiting order after a failed admission
                if not self._admit(seq, item.num_tokens):
                    admission_failed = True
                    continue
                num_tokens = min(item.num_tokens, seq.num_uncomputed_tokens)
            else:
                if seq.status is not SequenceStatus.RUNNING:
                    continue  # preempted earlier in this step
                num_tokens = min(item.num_tokens, seq.num_tokens - seq.num_computed_tokens)
                # fast path: most decode steps stay inside the last block, so there is nothing to allocate
                if (seq.num_computed_tokens + num_tokens > len(seq.block_table) * block_size
                        and not self._allocate_running(seq, num_tokens, batch.seqs)):
                    return batch, admission_failed
            batch.seqs.append(seq)
            batch.num_tokens.append(num_tokens)
        return batch, admission_failed

    def _admit(self, seq: Sequence, num_tokens: int) -> bool:
        """Match the prefix cache and allocate; on failure undo, leaving ``seq`` where it waited."""
        if self.waiting[0] is seq:  # the usual case: admissions go in waiting order (no O(n) search)
            position = 0
            self.waiting.popleft()
        else:
            position = self.waiting.index(seq)
            del self.waiting[position]
        cached = self.block_manager.match_prefix(seq, cached_token_limit(seq))
        num_tokens = min(num_tokens, seq.num_uncomputed_tokens)
        if not self.block_manager.allocate(seq, seq.num_computed_tokens + num_tokens):
            self.block_manager.free(seq)
            self.waiting.insert(position, seq)
            return False
        if seq.num_cached_tokens < 0:  # re-admissions after preemption find their own KV again: not prompt hits
            seq.num_cached_tokens = cached
            self.num_cached_tokens += cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.peak_running = max(self.peak_running, len(self.running))
        return True

    def _allocate_running(self, seq: Sequence, num_tokens: int, scheduled_seqs: list[Sequence]) -> bool:
        """Allocate for a running sequence, preempting the latest arrival not yet scheduled while
        that is someone else; False (``seq`` preempted itself) when ``seq`` is the latest."""
        scheduled = set(map(id, scheduled_seqs))  # seq itself is not in it yet: it may be the victim
        while not self.block_manager.allocate(seq, seq.num_computed_tokens + num_tokens):
            if self.preempt_latest(scheduled) is seq:
                return False
        return True

    def preempt_latest(self, exclude=()) -> Sequence | None:
        """Preempt the latest-arrived running sequence whose id is not in ``exclude``, as KV pressure does (the
        conformance driver forces it in any state); it, or None if none. It goes back to the front of the
        waiting queue without KV (recomputed later)."""
        candidates = [s for s in self.running if id(s) not in exclude]
        if not candidates:
            return None
        victim = max(candidates, key=lambda s: s.arrival_index)
        self.block_manager.free(victim)
        self._reset_ids.append(victim.seq_id)
        self.running.remove(victim)
        victim.status = SequenceStatus.WAITING
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        return victim

    def _plan(self, batch: ScheduledBatch) -> StepPlan:
        """The runner's view of ``batch``: one row per sequence, plus what changed since the previous plan."""
        plan = StepPlan(list(map(scheduled_row, batch.seqs, batch.num_tokens)), self._finished_ids, self._reset_ids)
        self._finished_ids, self._reset_ids, self.batch, self.plan = [], [], batch, plan
        if self.lookahead is not None:  # the planned step's forward ran: usable if this is exactly its batch
            plan.ahead_rows = self.lookahead.rows_for(batch.seqs, batch.total_tokens)
            if plan.ahead_rows is None:
                self.discard_lookahead()
            else:
                self.num_overlapped_steps += 1
                self.lookahead = None
        return plan

    # ---- planning a step ahead -----------------------------------------------------------
    def plan_ahead(self) -> AheadPlan | None:
        """The decode step after the latest plan, assuming each of its rows goes on (see ``lookahead.py``), with
        the blocks it needs allocated; None when the next step may differ. The next ``schedule()`` uses it."""
        batch = self.batch
        rows = lookahead_rows(batch.seqs, batch.total_tokens, self.waiting, self.running, self.block_manager,
                              self.max_model_len)
        if rows is None:
            return None
        self.lookahead, ahead = plan_lookahead(batch.seqs, rows, self.block_manager)
        return ahead

    def cancel_lookahead(self) -> None:
        """The runner could not queue the planned step: give its blocks back."""
        if self.lookahead is not None:
            self._reset_ids += self.lookahead.undo_blocks(self.block_manager)
            self.lookahead = None

    def discard_lookahead(self) -> None:
        """Throw the planned step away (another batch runs, or every row ended), counting it."""
        if self.lookahead is not None:
            self.num_discarded_lookaheads += 1
            self.lookahead = None

    # ---- after the step ------------------------------------------------------------------
    def update(self, plan: StepPlan, output: StepOutput, stop_of: StopCheck) -> list[Sequence]:
        """Apply a step: advance each row's computed tokens (publishing blocks it filled), append each sampled
        token (and its logprobs), apply the stop ``stop_of`` reports and free what finished; returns those."""
        block_manager, block_size = self.block_manager, self.block_manager.block_size
        seqs, prefilled = self.batch.seqs, []
        for seq, row in zip(seqs, plan.rows):
            seq.num_computed_tokens += len(row.token_ids)
            if seq.num_computed_tokens // block_size > seq.num_published_blocks:  # only when a block filled up
                block_manager.publish(seq)
            if row.prompt_targets is not None:  # only positions not scored before: a recomputed chunk repeats some
                seq.prompt_logprobs += output.prompt_logprobs[seq.seq_id][len(seq.prompt_logprobs) - row.start:]
            if not row.samples and ends_after_prefill(seq, row):
                prefilled.append(seq)
        if len(output.seq_ids) < len(seqs):  # rank 0 samples exactly the rows that reach their newest token
            seqs = [seq for seq, row in zip(seqs, plan.rows) if row.samples]
        assert plan is self.plan and len(seqs) == len(output.token_ids), "the output does not answer the latest plan"
        finished = []
        for seq in prefilled:
            seq.finish_reason, seq.stop_reason = "length", None
            self.finish(seq)
            finished.append(seq)
        logprobs = output.logprobs
        for i, (seq, token_id) in enumerate(zip(seqs, output.token_ids)):
            seq.append_token(token_id)
            if logprobs is not None and seq.output_logprobs is not None:
                seq.output_logprobs.append(logprobs[i])
            stop = stop_of(seq)
            if stop is not None:
                seq.finish_reason, seq.stop_reason = stop
                self.finish(seq)
                finished.append(seq)
        return finished

    def finish(self, seq: Sequence) -> None:
        self.waiting_since.pop(seq.seq_id, None)
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self._finished_ids.append(seq.seq_id)

    def abort(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.finish(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self.waiting_since.pop(seq.seq_id, None)
            self._finished_ids.append(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = seq.finish_reason or "abort"

    @contextmanager
    def borrowed_row(self, token_ids: list[int]) -> Iterator[ScheduledRow]:
        """A row computing all of ``token_ids`` on blocks borrowed while the block runs (evaluation on an idle
        engine); ValueError if they do not fit."""
        seq = Sequence(-1, -1, token_ids, SamplingParams(max_tokens=1), max_tokens=1)
        if not token_ids or not self.block_manager.allocate(seq, len(token_ids)):
            bm = self.block_manager
            raise ValueError(f"{len(token_ids)} tokens do not fit in the KV cache ({bm.num_blocks} blocks of "
                             f"{bm.block_size}); use a shorter window or more KV blocks")
        try:
            yield ScheduledRow(-1, 0, list(token_ids), list(seq.block_table), True, 0, seq.sampling)
        finally:
            self.block_manager.free(seq)
