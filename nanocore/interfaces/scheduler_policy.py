"""SchedulerPolicy: which sequences run in the next forward, and how many tokens each.

The policy only decides. The core validates the decision (token budget, ``max_num_seqs``, block
availability), matches prefix-cache blocks, allocates, preempts by recomputation when KV runs out,
and runs the step. A sequence scheduled for fewer tokens than it has uncomputed is a prefill chunk;
the core keeps its positions contiguous.

Rules (the core raises ``PolicyError`` on a decision that breaks the first three; the conformance suite checks
all of them):
- Each item names a waiting or running sequence once, for 1..``num_uncomputed_tokens`` tokens; the items fit
  ``budget.max_num_batched_tokens`` and ``budget.max_num_seqs``.
- ``schedule`` may be called several times in one step (after a preemption, or with ``waiting`` hidden when an
  admission did not fit) and must not change the sequences or the state it is given: decide from what it sees.
  Such a re-ask has ``state.retry`` True (since 1.5); asked again with the same queues and budget, decide the same.
  How long a sequence has gone without tokens is in the state (``state.steps_waited(seq)``, since 1.5), so aging
  needs no counters of the policy's own; a policy that keeps some advances them only when ``state.retry`` is False.
  (A policy declaring ``api_version = "1.0"`` is held to 1.0's rules: its re-asked decisions may differ.)
- With nothing running and something waiting, schedule at least one sequence (else the engine cannot progress).
- Bounded waiting: a waiting request must get its first tokens within a bounded number of steps while requests
  keep arriving; a policy may overtake arrival order, but never starve a request forever.

Constructor: ``__init__(self, options: dict | None = None)`` with the user's ``scheduler_policy_options``.

``conformance_requirements`` a policy may declare (a class attribute dict, read by every conformance class):
``{"admission_order": None}`` when it may give a later arrival its first tokens before an earlier one (the default
``"arrival"`` promises it never does; the bounded wait applies either way). ``{"step_order": ...}`` promises a step
order, checked on fixed states (default None: no promise). Prefill candidates are the running sequences with two or
more uncomputed tokens (oldest first), then the waiting ones in order; prefill tokens go to a prefix of them, and to
the first whenever its remaining prompt (capped by the token room) fits the free blocks left.
``"prefills_first"``: prefill chunks with no decode when the first candidate fits, else (none fits one token) one
token each for the first ``min(max_num_seqs, max_num_batched_tokens)`` running sequences. ``"decodes_first"``: one
token each for the first ``min(decodes, max_num_seqs, max_num_batched_tokens)`` decoding sequences (one uncomputed
token), then chunks from what they leave (a decode reserves the blocks of its one token).
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Protocol, Sequence

from nanocore.interfaces.base import Backend


class SequenceView(Protocol):
    """What a policy may read of a sequence (the engine's ``Sequence`` satisfies it)."""

    seq_id: int
    arrival_index: int
    num_prompt_tokens: int
    num_tokens: int  # prompt + generated so far
    num_computed_tokens: int  # tokens whose KV is already in the cache
    num_blocks: int  # KV blocks the sequence holds now

    @property
    def num_uncomputed_tokens(self) -> int: ...


@dataclass
class SchedulerState:
    #: Not yet admitted (or preempted) sequences, in the order they should be considered.
    waiting: Sequence[SequenceView]
    #: Admitted sequences holding KV blocks, oldest first.
    running: Sequence[SequenceView]
    #: Number of the step being planned (0, 1, ...; the same in every call of one step). Since 1.5.
    step: int = 0
    #: True when the core asks again in the same step (after a preemption, or with ``waiting`` hidden when an
    #: admission did not fit): the previous answer was not run as decided. Since 1.5.
    retry: bool = False
    #: ``seq_id`` -> first step of its current wait: the step it arrived in, or the one after it last got tokens
    #: (read-only; ``steps_waited`` reads it). Since 1.5.
    waiting_since: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def steps_waited(self, seq: SequenceView) -> int:
        """Steps that passed ``seq`` over since it arrived or last got tokens (0 when it arrives now or ran in the
        previous step). Aging reads this instead of counting calls."""
        return max(0, self.step - self.waiting_since.get(seq.seq_id, self.step))


@dataclass
class StepBudget:
    max_num_batched_tokens: int
    max_num_seqs: int
    num_free_blocks: int
    block_size: int

    def blocks_needed(self, seq: SequenceView, num_new_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_new_tokens`` more tokens of KV."""
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - seq.num_blocks)


@dataclass
class ScheduledItem:
    seq: SequenceView
    num_tokens: int


@dataclass
class ScheduleDecision:
    items: list[ScheduledItem] = field(default_factory=list)
    #: Total tokens of ``items``, kept up to date by ``add`` (policies check it once per candidate).
    num_tokens: int = 0

    def __post_init__(self):
        self.num_tokens = sum(item.num_tokens for item in self.items)

    def add(self, seq: SequenceView, num_tokens: int) -> None:
        self.items.append(ScheduledItem(seq, num_tokens))
        self.num_tokens += num_tokens


def add_prefill_chunks(decision: ScheduleDecision, candidates: Sequence[SequenceView], budget: StepBudget,
                       free_blocks: int, chunk_size: int = 0) -> int:
    """Give ``candidates`` (in order) prefill chunks from the budget left in ``decision``; ``chunk_size``
    caps a chunk (0 = no cap). Stops at the first that does not fit the free blocks, so smaller prompts
    never overtake. Returns the free blocks left."""
    for seq in candidates:
        token_room = budget.max_num_batched_tokens - decision.num_tokens
        if token_room <= 0 or len(decision.items) >= budget.max_num_seqs:
            break
        num_tokens = min(seq.num_uncomputed_tokens, token_room)
        if chunk_size:
            num_tokens = min(num_tokens, chunk_size)
        needed = budget.blocks_needed(seq, num_tokens)
        if needed > free_blocks:
            break
        free_blocks -= needed
        decision.add(seq, num_tokens)
    return free_blocks


class SchedulerPolicy(Backend):
    @abstractmethod
    def schedule(self, state: SchedulerState, budget: StepBudget) -> ScheduleDecision:
        """Pick (sequence, tokens this step) pairs within ``budget``. An empty decision with work
        waiting means "nothing fits"; the core then preempts or reports the request as too large."""
