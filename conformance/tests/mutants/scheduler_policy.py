"""Scheduler policies the suite must accept (CORRECT) and reject (MUTANTS).

``FifoPrefillFirst`` is prefill_first written from the interface alone, as a third party would; each mutant
changes one thing of it. decode_first (which overtakes prefills with decodes) must pass as well.
"""
from __future__ import annotations

from dataclasses import replace

from nanocore.interfaces import ScheduleDecision, SchedulerPolicy, SchedulerState, add_prefill_chunks, check_options
from nanocore_conformance import SchedulerPolicyConformance, bind_all
from nanocore_decode_first import DecodeFirstPolicy


class FifoPrefillFirst(SchedulerPolicy):
    """Prefill chunks (running prompts, then waiting ones in order) if any fit, otherwise one decode each."""

    conformance_requirements = {"step_order": "prefills_first"}

    def __init__(self, options=None):
        super().__init__(check_options("fifo_prefill_first", dict(options or {}), {"chunk_size": int}))
        self.chunk_size = self.options.get("chunk_size", 0)

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        prefilling = [s for s in state.running if s.num_uncomputed_tokens > 1]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, budget.num_free_blocks, self.chunk_size)
        if decision.items:
            return decision
        for seq in state.running:
            if len(decision.items) >= budget.max_num_seqs or decision.num_tokens >= budget.max_num_batched_tokens:
                break
            decision.add(seq, 1)
        return decision


class ChunkedFifoPrefillFirst(FifoPrefillFirst):
    """The same with 5-token prefill chunks."""

    bound_options = {"chunk_size": 5}


class DecodeFirstChunk8(DecodeFirstPolicy):
    """decode_first with 8-token chunks."""

    bound_options = {"chunk_size": 8}


class AgingShortestFirst(FifoPrefillFirst):
    """Shortest waiting prompt first, but one passed over 3 steps goes to the front: aging read from the state
    (``steps_waited``, API 1.5), no counters of its own."""

    conformance_requirements = {"admission_order": None}

    def schedule(self, state, budget):
        aged = [s for s in state.waiting if state.steps_waited(s) >= 3]
        rest = sorted((s for s in state.waiting if s not in aged), key=lambda seq: seq.num_prompt_tokens)
        return super().schedule(replace(state, waiting=[*aged, *rest]), budget)


class ResumesRememberedPrompt(FifoPrefillFirst):
    """Remembers the prompt it is chunking; when that prompt is missing from the state while it still has KV and
    prompt tokens left, it assumes the core hid it and resumes it from memory: a prompt aborted mid-prefill is
    scheduled again."""

    bound_options = {"chunk_size": 4}

    def __init__(self, options=None):
        super().__init__(options)
        self.chunking = None

    def schedule(self, state, budget):
        seq = self.chunking
        given = {id(s) for s in (*state.waiting, *state.running)}
        if seq is not None and id(seq) not in given and 0 < seq.num_computed_tokens < seq.num_prompt_tokens:
            state = replace(state, running=[seq, *state.running])
        decision = super().schedule(state, budget)
        self.chunking = next((i.seq for i in decision.items if i.num_tokens < i.seq.num_uncomputed_tokens), seq)
        return decision


class MisspelledRequirement(AgingShortestFirst):
    """Declares a requirement the suite does not know (a typo): it must fail naming the keys it may declare, not
    silently test under the default."""

    conformance_requirements = {"admision_order": None}


class ShortestPromptFirst(FifoPrefillFirst):
    """Admits the shortest waiting prompt first: a long prompt starves while short ones keep arriving."""

    def schedule(self, state, budget):
        waiting = sorted(state.waiting, key=lambda seq: seq.num_prompt_tokens)
        return super().schedule(SchedulerState(waiting, state.running), budget)


class IgnoresTokenBudget(FifoPrefillFirst):
    """Schedules every uncomputed token of up to max_num_seqs sequences, whatever the token budget."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        for seq in [*state.running, *state.waiting][:budget.max_num_seqs]:
            decision.add(seq, seq.num_uncomputed_tokens)
        return decision


class IgnoresMaxNumSeqs(FifoPrefillFirst):
    """Never checks max_num_seqs (as if the core trimmed the batch)."""

    def schedule(self, state, budget):
        return super().schedule(state, replace(budget, max_num_seqs=1 << 30))


class SchedulesTwice(FifoPrefillFirst):
    """Mixed steps: prefill chunks, then a decode for every running sequence, even one just given a chunk."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        prefilling = [s for s in state.running if s.num_uncomputed_tokens > 1]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, budget.num_free_blocks)
        for seq in state.running:
            if decision.num_tokens < budget.max_num_batched_tokens and len(decision.items) < budget.max_num_seqs:
                decision.add(seq, 1)
        return decision


class SchedulesZeroTokens(FifoPrefillFirst):
    """Gives each sequence min(uncomputed, budget left) tokens, which is 0 once the budget is spent."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        for seq in [*state.running, *state.waiting][:budget.max_num_seqs]:
            decision.add(seq, min(seq.num_uncomputed_tokens, budget.max_num_batched_tokens - decision.num_tokens))
        return decision


class ChunkFromPromptLength(FifoPrefillFirst):
    """Sizes a prefill chunk from the prompt length, not the uncomputed tokens: a resumed prompt overshoots."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        for seq in [*(s for s in state.running if s.num_uncomputed_tokens > 1), *state.waiting]:
            room = budget.max_num_batched_tokens - decision.num_tokens
            if room <= 0 or len(decision.items) >= budget.max_num_seqs:
                break
            decision.add(seq, min(seq.num_prompt_tokens, room))
        return decision if decision.items else super().schedule(state, budget)


class AdvancesSequences(FifoPrefillFirst):
    """Does the core's bookkeeping itself: advances num_computed_tokens of what it schedules."""

    def schedule(self, state, budget):
        decision = super().schedule(state, budget)
        for item in decision.items:
            item.seq.num_computed_tokens += item.num_tokens
        return decision


class PopsAdmittedFromWaiting(FifoPrefillFirst):
    """Removes the prompts it admits from state.waiting, as if the queue were its own."""

    def schedule(self, state, budget):
        decision = super().schedule(state, budget)
        for item in decision.items:
            if item.seq in state.waiting:
                state.waiting.remove(item.seq)
        return decision


class PrefillIgnoresDecodeBlocks(DecodeFirstPolicy):
    """decode_first whose prefill chunks are sized against every free block, as if decodes needed none."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        decoding = [s for s in state.running if s.num_uncomputed_tokens == 1]
        for seq in decoding[:min(budget.max_num_seqs, budget.max_num_batched_tokens)]:
            decision.add(seq, 1)
        prefilling = [s for s in state.running if s.num_uncomputed_tokens > 1]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, budget.num_free_blocks, self.chunk_size)
        return decision


class DecodesStopAtAPrefill(DecodeFirstPolicy):
    """decode_first whose decode loop ends at the first running sequence still prefilling: the decodes behind it
    get no token until that prompt is done."""

    def schedule(self, state, budget):
        running = list(state.running)
        cut = next((i for i, s in enumerate(running) if s.num_uncomputed_tokens > 1), len(running))
        hidden = [s for s in running[cut:] if s.num_uncomputed_tokens == 1]
        return super().schedule(replace(state, running=[s for s in running if s not in hidden]), budget)


class ReservesTwoTokensPerDecode(DecodeFirstPolicy):
    """decode_first that sets aside the blocks of two tokens per decode: a prefill chunk that fits the blocks the
    decodes leave is not run."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        free_blocks = budget.num_free_blocks
        decoding = [s for s in state.running if s.num_uncomputed_tokens == 1]
        for seq in decoding[:min(budget.max_num_seqs, budget.max_num_batched_tokens)]:
            free_blocks -= budget.blocks_needed(seq, 2)
            decision.add(seq, 1)
        prefilling = [s for s in state.running if s.num_uncomputed_tokens > 1]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, free_blocks, self.chunk_size)
        return decision


class MixesDecodesIntoPrefills(FifoPrefillFirst):
    """Declares prefills_first but counts every running sequence as a prefill candidate: decodes run in prefill
    steps."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        add_prefill_chunks(decision, [*state.running, *state.waiting], budget, budget.num_free_blocks)
        return decision if decision.items else super().schedule(state, budget)


class AdmitsBeforeShortPrefill(FifoPrefillFirst):
    """Counts as prefilling only running sequences with more than two uncomputed tokens: one with two left waits
    while new prompts are admitted."""

    def schedule(self, state, budget):
        decision = ScheduleDecision()
        prefilling = [s for s in state.running if s.num_uncomputed_tokens > 2]
        add_prefill_chunks(decision, [*prefilling, *state.waiting], budget, budget.num_free_blocks)
        return decision if decision.items else super().schedule(state, budget)


class RotatesDecodesPerCall(FifoPrefillFirst):
    """Rotates which running sequences decode first with a counter advanced on every call."""

    def __init__(self, options=None):
        super().__init__(options)
        self.calls = 0

    def schedule(self, state, budget):
        self.calls += 1
        start = self.calls % max(1, len(state.running))
        running = [*state.running[start:], *state.running[:start]]
        return super().schedule(SchedulerState(state.waiting, running), budget)


CORRECT = [FifoPrefillFirst, ChunkedFifoPrefillFirst, DecodeFirstPolicy, DecodeFirstChunk8, AgingShortestFirst]
MUTANTS = [ShortestPromptFirst, IgnoresTokenBudget, IgnoresMaxNumSeqs, SchedulesTwice, SchedulesZeroTokens,
           ChunkFromPromptLength, AdvancesSequences, PopsAdmittedFromWaiting, RotatesDecodesPerCall,
           ResumesRememberedPrompt, MisspelledRequirement, PrefillIgnoresDecodeBlocks, DecodesStopAtAPrefill,
           ReservesTwoTokensPerDecode, MixesDecodesIntoPrefills, AdmitsBeforeShortPrefill]
bind_all(globals(), SchedulerPolicyConformance, CORRECT + MUTANTS)
