"""The step orders a policy may declare (``conformance_requirements = {"step_order": ...}``), checked on fixed states.

A sequence with one uncomputed token is decoding; one with two or more is still prefilling. The prefill candidates
are the running sequences still prefilling (oldest first), then the waiting ones in order; a declared order gives
prefill tokens to a prefix of them (a candidate runs only after every one before it) and to the first whenever its
whole remaining prompt, capped by the token room, fits the free blocks left:

- ``"prefills_first"``: a step runs prefill chunks if the first candidate fits, with no decode among them; with no
  candidate, or a first one whose single next token does not fit the free blocks, it gives one token to each of the
  first ``min(max_num_seqs, max_num_batched_tokens)`` running sequences.
- ``"decodes_first"``: each of the first ``min(decodes, max_num_seqs, max_num_batched_tokens)`` decoding sequences
  gets one token; prefill chunks take the tokens, sequences and blocks those decodes leave (a decode needs only the
  blocks its one token needs).
"""
from __future__ import annotations

from nanocore.interfaces import SchedulerState, StepBudget
from nanocore_conformance.scheduler_sim import FakeSequence, described

STEP_ORDERS = ("prefills_first", "decodes_first")


def decodes_among_prefills_state() -> SchedulerState:
    """Block size 4. Running, oldest first: decoding seq 0 (its next token fits its last block, a second one would
    not), seq 1 still prefilling with exactly two tokens left (one new block), decoding seq 2 at a block boundary
    (one new block), seq 3 half prefilled (six tokens left, two new blocks); then a waiting 4-token prompt (one
    block)."""
    running = [FakeSequence(0, 0, 5, 8, 7, 2, 9), FakeSequence(1, 1, 10, 10, 8, 2, 9),
               FakeSequence(2, 2, 3, 5, 4, 1, 9), FakeSequence(3, 3, 14, 14, 8, 2, 9)]
    return SchedulerState(waiting=[FakeSequence(4, 4, 4, 4, 0, 0, 9)], running=running)


def _candidates(state: SchedulerState) -> tuple[list, list]:
    decoding = [s for s in state.running if s.num_uncomputed_tokens == 1]
    return decoding, [*(s for s in state.running if s.num_uncomputed_tokens > 1), *state.waiting]


def _check_prefix(order: str, candidates: list, given: dict[int, int], decision) -> None:
    ran = [id(s) in given for s in candidates]
    if False in ran and True in ran[ran.index(False):]:
        skipped = candidates[ran.index(False)]
        later = candidates[ran.index(False) + ran[ran.index(False):].index(True)]
        raise AssertionError(
            f"step_order {order!r}: decision {described(decision)} ([(seq_id, tokens)]) gives prefill tokens to "
            f"sequence {later.seq_id} but none to sequence {skipped.seq_id}, which comes before it (running prefills "
            f"oldest first, then waiting in order): a declared order never lets a candidate overtake")


def _check_first_fits(order: str, candidates: list, given: dict[int, int], decision, room: int, free: int,
                      budget: StepBudget) -> bool:
    """Whether the first candidate's whole remaining prompt (capped by the room) fits; then it must have run."""
    if not candidates or room <= 0:
        return False
    first = candidates[0]
    need = budget.blocks_needed(first, min(first.num_uncomputed_tokens, room))
    assert need > free or id(first) in given, (
        f"step_order {order!r}: decision {described(decision)} gives sequence {first.seq_id}, the first prefill "
        f"candidate, no tokens, although its {first.num_uncomputed_tokens} uncomputed tokens (capped by the "
        f"{room} tokens of room) need {need} new blocks and {free} are left"
        + (" after the decodes' next tokens" if order == "decodes_first" else ""))
    return need <= free


def _check_decodes(order: str, decoding: list, given: dict[int, int], decision, count: int, what: str) -> None:
    want = [s.seq_id for s in decoding[:count]]
    got = [s.seq_id for s in decoding if given.get(id(s)) == 1]
    assert got == want, (
        f"step_order {order!r}: decision {described(decision)} ([(seq_id, tokens)]) gives one token to {got} of "
        f"{what} {[s.seq_id for s in decoding]}; it must give one to exactly the first {count} in running order "
        f"(as many as max_num_seqs and max_num_batched_tokens allow): {want}")


def check_step_order(order: str, state: SchedulerState, budget: StepBudget, decision) -> None:
    """``decision`` (already valid for ``state`` and ``budget``) follows the declared ``order``."""
    assert order in STEP_ORDERS, (
        f"conformance_requirements step_order is {order!r}; declare one of {list(STEP_ORDERS)} or None (no order)")
    given = {id(item.seq): item.num_tokens for item in decision.items}
    decoding, candidates = _candidates(state)
    room, slots, free = budget.max_num_batched_tokens, budget.max_num_seqs, budget.num_free_blocks
    if order == "decodes_first":
        count = min(len(decoding), slots, room)
        _check_decodes(order, decoding, given, decision, count, "the decoding sequences")
        free -= sum(budget.blocks_needed(s, 1) for s in decoding[:count])
        room, slots = room - count, slots - count
        _check_prefix(order, candidates, given, decision)
        if slots > 0:
            _check_first_fits(order, candidates, given, decision, room, free, budget)
        return
    if not candidates or budget.blocks_needed(candidates[0], 1) > free:  # no chunk fits: a decode step
        count = min(len(state.running), slots, room)
        _check_decodes(order, list(state.running), given, decision, count,
                       "the running sequences (no prefill fits, so the step decodes)")
        assert len(decision.items) == count, (
            f"step_order {order!r}: decision {described(decision)} runs other sequences beside one token for each "
            f"of the first {count} running ones, but the first prefill candidate does not fit a single token's "
            f"blocks: the step only decodes")
        return
    _check_prefix(order, candidates, given, decision)
    if not _check_first_fits(order, candidates, given, decision, room, free, budget):
        return  # only a chunk smaller than the whole prompt could fit: a chunk, or the decodes if none does
    mixed = [s.seq_id for s in decoding if id(s) in given]
    assert not mixed, (
        f"step_order {order!r}: decision {described(decision)} runs prefill chunks and also decodes {mixed}; a "
        f"prefills-first step that runs prefill chunks runs no decode")
