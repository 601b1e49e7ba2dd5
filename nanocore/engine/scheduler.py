"""Scheduler mechanics: run the policy, validate its decision, admit, allocate, preempt.

The policy (a plugin) only decides. Everything that keeps the engine correct happens here: a bad
decision is a clear error naming the policy, prefix-cache hits shrink the work of new sequences,
and KV exhaustion preempts the latest-arrived running sequence (recomputed later) instead of crashing.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

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
        self.num_cached_tokens = 0  # prefix-cache hits of admitted sequences

    # ---- admission -----------------------------------------------------------------------
    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Reject a request that can never run, instead of letting it wait forever."""
        total = num_prompt_tokens + max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} exceeds "
                f"max_model_len {self.max_model_len}; shorten the prompt or lower max_tokens")
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

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Decide, validate and allocate one step. Preempts (and asks the policy again) when KV runs out."""
        while True:
            budget = StepBudget(self.max_num_batched_tokens, self.max_num_seqs,
                                self.block_manager.num_free_blocks, self.block_manager.block_size)
            decision = self.policy.schedule(SchedulerState(list(self.waiting), list(self.running)), budget)
            self._validate(decision, budget)
            preempted_before = self.num_preemptions
            batch = self._apply(decision)
            if batch.seqs:
                return batch
            if self.num_preemptions == preempted_before and not self._preempt_latest(exclude=()):
                raise PolicyError(
                    f"scheduler policy {self.policy_name!r} scheduled nothing for {len(self.waiting)} waiting "
                    f"sequence(s) although the whole KV cache ({self.block_manager.num_free_blocks} blocks) is "
                    f"available; the policy must schedule at least one sequence when nothing is running")

    def _validate(self, decision: ScheduleDecision, budget: StepBudget) -> None:
        def fail(why: str) -> None:
            raise PolicyError(f"scheduler policy {self.policy_name!r} returned an invalid decision: {why}")

        if not isinstance(decision, ScheduleDecision):
            fail(f"expected a ScheduleDecision, got {type(decision).__name__}")
        known = {id(s) for s in self.waiting} | {id(s) for s in self.running}
        seen: set[int] = set()
        for item in decision.items:
            seq, n = item.seq, item.num_tokens
            if id(seq) not in known:
                fail(f"sequence {getattr(seq, 'seq_id', seq)!r} is neither waiting nor running")
            if id(seq) in seen:
                fail(f"sequence {seq.seq_id} is scheduled twice")
            seen.add(id(seq))
            if not isinstance(n, int) or not 1 <= n <= seq.num_uncomputed_tokens:
                fail(f"sequence {seq.seq_id} scheduled for {n!r} tokens; allowed 1..{seq.num_uncomputed_tokens} "
                     f"(its uncomputed tokens)")
        if len(decision.items) > budget.max_num_seqs:
            fail(f"{len(decision.items)} sequences exceed max_num_seqs {budget.max_num_seqs}")
        if decision.num_tokens > budget.max_num_batched_tokens:
            fail(f"{decision.num_tokens} tokens exceed max_num_batched_tokens {budget.max_num_batched_tokens}")

    def _apply(self, decision: ScheduleDecision) -> ScheduledBatch:
        """Admit and allocate in decision order; on exhaustion preempt others, or end the batch here."""
        batch = ScheduledBatch([], [])
        scheduled: set[int] = set()
        waiting_at_decision = {id(s) for s in self.waiting}
        for item in decision.items:
            seq = item.seq
            newly_admitted = id(seq) in waiting_at_decision
            if seq.status is not (SequenceStatus.WAITING if newly_admitted else SequenceStatus.RUNNING):
                continue  # preempted earlier in this step
            if newly_admitted:
                position = self.waiting.index(seq)
                self.waiting.remove(seq)
                cached = self.block_manager.match_prefix(seq)
            num_tokens = min(item.num_tokens, seq.num_uncomputed_tokens)
            while not self.block_manager.allocate(seq, seq.num_computed_tokens + num_tokens):
                if self._preempt_latest(exclude=scheduled | {id(seq)}):
                    continue
                if newly_admitted:  # undo the admission: it waits where it was
                    self.block_manager.free(seq)
                    self.waiting.insert(position, seq)
                else:
                    self._preempt(seq)
                return batch
            if newly_admitted:
                self._admitted(seq, cached)
            scheduled.add(id(seq))
            batch.seqs.append(seq)
            batch.num_tokens.append(num_tokens)
        return batch

    def _admitted(self, seq: Sequence, cached: int) -> None:
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = cached
        self.num_cached_tokens += cached
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _preempt_latest(self, exclude) -> bool:
        """Preempt the latest-arrived running sequence not in ``exclude``; False if there is none."""
        candidates = [s for s in self.running if id(s) not in exclude]
        if not candidates:
            return False
        self._preempt(max(candidates, key=lambda s: s.arrival_index))
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s KV and put it back at the front of the waiting queue (recompute later)."""
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ---- after the step ------------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def abort(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.finish(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = seq.finish_reason or "abort"
