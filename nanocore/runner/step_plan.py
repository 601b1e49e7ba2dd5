"""The step plan: what the scheduler asks every rank to compute in one step, as plain data.

A plan holds ints, floats and lists of them, never engine objects, so every rank (another process, later another
host) runs the same plan. ``StepOutput`` is rank 0's answer: the sampled token of each row that samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class RowSampling:
    """How one sequence samples, fixed for its lifetime."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    logprobs: int | None  # top-N logprobs per sampled token (None: none)
    seed: int | None  # the sequence's own random stream (None: the runner's shared generator)
    min_tokens: int
    min_tokens_banned: tuple[int, ...]  # ids banned until ``min_tokens`` outputs: stop ids, EOS unless ignored
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), sorted by id


@dataclass(slots=True)
class ScheduledRow:
    """One sequence's work in a step: ``token_ids`` at positions ``start, start + 1, ...`` of sequence ``seq_id``."""

    seq_id: int
    start: int  # tokens of the sequence already computed (in the KV cache)
    token_ids: list[int]
    #: the sequence's whole table, covering every position the row writes; read it while the step is planned and run
    #: (the scheduler shares its list rather than copy it every step, and may grow it for later steps)
    block_table: list[int]
    samples: bool  # the row reaches the sequence's newest token, so the step samples its next one
    num_output_tokens: int  # tokens generated so far (min_tokens bans)
    sampling: RowSampling
    #: prompt logprobs this step scores: for positions ``start, start + 1, ...`` the prompt token that follows
    #: each (None: none); the rank that samples returns the target's logprob, rank and the top ``num_prompt_logprobs``
    prompt_targets: list[int] | None = None
    num_prompt_logprobs: int = 0


seq_id_of = attrgetter("seq_id")


@dataclass
class StepPlan:
    """One step for every rank: the rows in batch order, and what changed since the previous plan."""

    rows: list[ScheduledRow]
    #: sequences that finished or were aborted since the previous plan: runners drop what they keep for them
    finished_seq_ids: list[int] = field(default_factory=list)
    #: sequences whose block table was freed or cut back since the previous plan: cached table rows are stale
    reset_seq_ids: list[int] = field(default_factory=list)
    #: rows of the previous ``AheadPlan`` this plan repeats, in order: their forward already ran (None: it does not)
    ahead_rows: list[int] | None = None
    #: structured output: the allowed next tokens of each constrained row that samples (int32 ``[rows, words]``, CPU,
    #: ``nanocore.toolkit.token_bitmask`` layout), filled by the engine; only rank 0 samples, so it stays on rank 0
    token_bitmask: torch.Tensor | None = field(default=None, compare=False)
    #: for each bitmask row, the index among this step's sampling rows (``rows`` with ``samples``) it masks
    bitmask_rows: list[int] | None = field(default=None, compare=False)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    def seq_ids(self) -> tuple[int, ...]:
        """The rows' sequences in order: what the runner's caches key on."""
        return tuple(map(seq_id_of, self.rows))


@dataclass
class AheadPlan:
    """A decode step queued before the previous plan's samples reach the host: row ``i`` computes position
    ``positions[i]`` of sequence ``seq_ids[i]``, fed the token sampled for row ``source_rows[i]`` of that plan's
    output (None: every sampled row, in order)."""

    seq_ids: list[int]
    positions: list[int]
    block_tables: list[list[int]]
    source_rows: list[int] | None


@dataclass
class StepOutput:
    """The sampled token of each row that sampled, in plan order."""

    seq_ids: list[int]
    token_ids: list[int]
    #: per sampled row: (token ids, logprobs, rank of the sampled token); the first id is the sampled one
    logprobs: list[tuple[list[int], list[float], int]] | None = None
    #: seq id -> one such entry per position of its row's ``prompt_targets`` (the first id is the target)
    prompt_logprobs: dict[int, list[tuple[list[int], list[float], int]]] | None = None


ROW_FIELDS = ("seq_id", "start", "token_ids", "block_table", "samples", "num_output_tokens")
PROMPT_FIELDS = ("prompt_targets", "num_prompt_logprobs")  # after ``sampling``, with defaults
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "logprobs", "seed", "min_tokens", "min_tokens_banned")


def encode_plan(plan: StepPlan) -> dict[str, list]:
    """``plan`` as columns of ints, floats and lists of them (what travels to other ranks: data, never objects).
    Sampling settings go once per distinct setting (most rows of a batch share one), each row naming its index.
    The token bitmask is not among them: it only matters where sampling happens, on rank 0."""
    rows = plan.rows
    columns = {name: [getattr(r, name) for r in rows] for name in (*ROW_FIELDS, *PROMPT_FIELDS)}
    distinct: dict[RowSampling, int] = {}
    columns["sampling_index"] = [distinct.setdefault(r.sampling, len(distinct)) for r in rows]
    columns["sampling"] = [[*(getattr(s, name) for name in SAMPLING_FIELDS[:-1]), list(s.min_tokens_banned)]
                           for s in distinct]
    columns["logit_bias"] = [[list(pair) for pair in s.logit_bias] for s in distinct]  # [id, bias] pairs
    columns["finished_seq_ids"], columns["reset_seq_ids"] = plan.finished_seq_ids, plan.reset_seq_ids
    columns["ahead_rows"] = plan.ahead_rows
    return columns


def decode_plan(columns: dict[str, list]) -> StepPlan:
    """The ``StepPlan`` that ``encode_plan`` wrote; ValueError on columns of different lengths or a sampling index
    out of range (a malformed message)."""
    lengths = {name: len(columns[name]) for name in (*ROW_FIELDS, "sampling_index", *PROMPT_FIELDS)}
    if len(set(lengths.values())) != 1 or len(columns["sampling"]) != len(columns["logit_bias"]):
        raise ValueError(f"malformed step plan: its columns have different lengths {lengths}, "
                         f"{len(columns['sampling'])} sampling settings, {len(columns['logit_bias'])} logit biases")
    table = [RowSampling(*values[:-1], tuple(values[-1]), tuple(map(tuple, bias)))
             for values, bias in zip(columns["sampling"], columns["logit_bias"], strict=True)]
    if not all(0 <= i < len(table) for i in columns["sampling_index"]):
        raise ValueError(f"malformed step plan: a sampling index is outside the {len(table)} settings it carries")
    rows = [ScheduledRow(*values, table[i], targets, num)
            for *values, i, targets, num in zip(*(columns[name] for name in ROW_FIELDS), columns["sampling_index"],
                                                *(columns[name] for name in PROMPT_FIELDS), strict=True)]
    return StepPlan(rows, columns["finished_seq_ids"], columns["reset_seq_ids"], columns["ahead_rows"])
