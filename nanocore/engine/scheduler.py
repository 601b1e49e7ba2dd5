"""Scheduler mechanics: run the policy, validate its decision, admit, allocate, preempt.

The policy (a plugin) only decides. Everything that keeps the engine correct happens here: a bad
decision is a clear error naming the policy, prefix-cache hits shrink the work of new sequences,
and KV exhaustion preempts the latest-arrived running sequence (recomputed later) instead of crashing.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import MappingProxyType

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.sequence import Sequence, SequenceStatus
from nanocore.interfaces import ScheduleDecision, SchedulerPolicy, SchedulerState, StepBudget


class PolicyError(RuntimeError):
    """A scheduler policy returned a decision the core cannot run."""


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
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first admission
        self.peak_running = 0  # most sequences running at once (benchmarks reset it)
        self.num_steps = 0  # steps planned so far: the policy's ``state.step``
        self.waiting_since: dict[int, int] = {}  # seq id -> first step of its current wait (``state.steps_waited``)

    # ---- admission -----------------------------------------------------------------------
    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Reject a request that can never run, instead of letting it wait forever. As in vLLM, output that
        would pass max_model_len is not an error: generation stops there with finish reason "length"."""
        if num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"the prompt has {num_prompt_tokens} tokens but max_model_len is {self.max_model_len} (prompt and "
                f"output together); shorten the prompt or raise max_model_len")
        total = min(num_prompt_tokens + max_tokens, self.max_model_len)
        bm = self.block_manager
        blocks = -(-total // bm.block_size)
        if blocks > bm.num_blocks:
            raise ValueError(
                f"prompt + max_tokens = {total} tokens needs {blocks} KV blocks of {bm.block_size} tokens but the "
                f"whole KV cache has {bm.num_blocks}; raise num_kv_blocks (or cpu_kv_cache_gib / "
                f"gpu_memory_utilization) or lower max_tokens")

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq.num_prompt_tokens, seq.max_tokens)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.waiting_since[seq.seq_id] = self.num_steps

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Decide, validate and allocate one step. Preempts (and asks the policy again) when KV runs out."""
        hide_waiting = False  # set when admissions did not fit: ask the policy for running work only
        since, retry = MappingProxyType(self.waiting_since), False
        while True:
            budget = StepBudget(self.max_num_batched_tokens, self.max_num_seqs,
                                self.block_manager.num_free_blocks, self.block_manager.block_size)
            waiting = [] if hide_waiting else list(self.waiting)
            state = SchedulerState(waiting, list(self.running), self.num_steps, retry, since)
            decision, retry = self.policy.schedule(state, budget), True
            self._validate(decision, budget, waiting)
            preempted_before = self.num_preemptions
            batch, admission_failed = self._apply(decision)
            if batch.seqs:
                self.num_steps += 1
                self.waiting_since.update((seq.seq_id, self.num_steps) for seq in batch.seqs)
                return batch
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

    def _validate(self, decision: ScheduleDecision, budget: StepBudget, waiting: list[Sequence]) -> None:
        def fail(why: str) -> None:
            raise PolicyError(f"scheduler policy {self.policy_name!r} returned an invalid decision: {why}")

        if not isinstance(decision, ScheduleDecision):
            fail(f"expected a ScheduleDecision, got {type(decision).__name__}")
        known = set(map(id, self.running))
        known.update(map(id, waiting))
        seen: set[int] = set()
        total = 0  # recounted: a policy may have built ``items`` without ``add``
        for item in decision.items:
            seq, n = item.seq, item.num_tokens
            key = id(seq)
            if key not in known:
                fail(f"sequence {getattr(seq, 'seq_id', seq)!r} is neither waiting nor running")
            if key in seen:
                fail(f"sequence {seq.seq_id} is scheduled twice")
            seen.add(key)
            uncomputed = seq.num_tokens - seq.num_computed_tokens
            if not isinstance(n, int) or not 1 <= n <= uncomputed:
                fail(f"sequence {seq.seq_id} scheduled for {n!r} tokens; allowed 1..{uncomputed} (its uncomputed tokens)")
            total += n
        if len(decision.items) > budget.max_num_seqs:
            fail(f"{len(decision.items)} sequences exceed max_num_seqs {budget.max_num_seqs}")
        if total > budget.max_num_batched_tokens:
            fail(f"{total} tokens exceed max_num_batched_tokens {budget.max_num_batched_tokens}")

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
        cached = self.block_manager.match_prefix(seq)
        num_tokens = min(num_tokens, seq.num_uncomputed_tokens)
        if not self.block_manager.allocate(seq, seq.num_computed_tokens + num_tokens):
            self.block_manager.free(seq)
            self.waiting.insert(position, seq)
            return False
        self._admitted(seq, cached)
        return True

    def _allocate_running(self, seq: Sequence, num_tokens: int, scheduled_seqs: list[Sequence]) -> bool:
        """Allocate for a running sequence, preempting the latest arrival not yet scheduled while
        that is someone else; False (``seq`` preempted itself) when ``seq`` is the latest."""
        scheduled = set(map(id, scheduled_seqs))  # seq itself is not in it yet: it may be the victim
        while not self.block_manager.allocate(seq, seq.num_computed_tokens + num_tokens):
            if self.preempt_latest(scheduled) is seq:
                return False
        return True

    def _admitted(self, seq: Sequence, cached: int) -> None:
        if seq.num_cached_tokens < 0:  # re-admissions after preemption find its own KV again: not prompt hits
            seq.num_cached_tokens = cached
            self.num_cached_tokens += cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.peak_running = max(self.peak_running, len(self.running))

    def preempt_latest(self, exclude=()) -> Sequence | None:
        """Preempt the latest-arrived running sequence whose id is not in ``exclude``, as KV pressure does (the
        conformance driver forces it in any state); it, or None if none."""
        candidates = [s for s in self.running if id(s) not in exclude]
        if not candidates:
            return None
        victim = max(candidates, key=lambda s: s.arrival_index)
        self._preempt(victim)
        return victim

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s KV and put it back at the front of the waiting queue (recompute later)."""
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ---- after the step ------------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        self.waiting_since.pop(seq.seq_id, None)
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def abort(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.finish(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self.waiting_since.pop(seq.seq_id, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = seq.finish_reason or "abort"
