"""``prefill_first``: Nano-vLLM's policy. A step runs prefills if any fit, otherwise decodes.

Prompts longer than the remaining token budget are chunked (``chunk_size`` caps a chunk further).
"""
from __future__ import annotations

from nanocore.interfaces import (
    ScheduleDecision,
    SchedulerPolicy,
    SchedulerState,
    StepBudget,
    add_prefill_chunks,
    builtin_options,
)


class PrefillFirstPolicy(SchedulerPolicy):
    auto_priority = 0
    conformance_requirements = {"step_order": "prefills_first"}

    def __init__(self, options=None):
        super().__init__(builtin_options(self, PrefillFirstPolicy, "prefill_first", options, {"chunk_size": int}))
        self.chunk_size = self.options.get("chunk_size", 0)
        if self.chunk_size < 0:
            raise ValueError(f"prefill_first chunk_size must be >= 0 (0 = no cap), got {self.chunk_size}")

    def schedule(self, state: SchedulerState, budget: StepBudget) -> ScheduleDecision:
        decision = ScheduleDecision()
        # Unfinished prefill chunks of running sequences first, then new prompts in order.
        prefilling = [s for s in state.running if s.num_uncomputed_tokens >= 2]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, budget.num_free_blocks, self.chunk_size)
        if decision.items:
            return decision
        # one token each: the first min(max_num_seqs, max_num_batched_tokens) running sequences fill the budget
        for seq in state.running[:min(budget.max_num_seqs, budget.max_num_batched_tokens)]:
            decision.add(seq, 1)
        return decision
