"""``decode_first``: every running decode gets its token, the rest of the budget goes to prefill chunks.

One step is one mixed forward: first one token for each running sequence that is decoding (oldest
first), then prefill chunks of at most ``chunk_size`` tokens, partially prefilled sequences before
new ones, new ones in arrival order. A long prompt therefore advances chunk by chunk while the
running decodes keep producing a token every step.
"""
from __future__ import annotations

from nanocore.interfaces import (
    ScheduleDecision,
    SchedulerPolicy,
    SchedulerState,
    StepBudget,
    add_prefill_chunks,
    check_options,
)

DEFAULT_CHUNK_SIZE = 128


class DecodeFirstPolicy(SchedulerPolicy):
    auto_priority = None  # a latency trade-off the user opts into; "auto" keeps prefill_first
    conformance_requirements = {"step_order": "decodes_first"}

    def __init__(self, options=None):
        super().__init__(check_options("decode_first", dict(options or {}), {"chunk_size": int}))
        self.chunk_size = self.options.get("chunk_size", DEFAULT_CHUNK_SIZE)
        if self.chunk_size < 0:
            raise ValueError(f"decode_first chunk_size must be an int >= 0 (0 = only the token budget caps a "
                             f"chunk), got {self.chunk_size!r}")

    def schedule(self, state: SchedulerState, budget: StepBudget) -> ScheduleDecision:
        decision = ScheduleDecision()
        free_blocks = budget.num_free_blocks
        decoding = [s for s in state.running if s.num_uncomputed_tokens < 2]  # only the last sampled token left
        # one token each: the first min(max_num_seqs, max_num_batched_tokens) decodes fill the budget
        for seq in decoding[:min(budget.max_num_seqs, budget.max_num_batched_tokens)]:
            # no block check: a decode that does not fit makes the core preempt the latest arrival
            free_blocks -= budget.blocks_needed(seq, 1)
            decision.add(seq, 1)
        prefilling = [s for s in state.running if s.num_uncomputed_tokens >= 2]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, free_blocks, self.chunk_size)
        return decision
