"""Prompt logprobs inside a step: logits for the prompt positions that rows ask to score, and only those.

A row with ``prompt_targets`` scores positions ``start, start + 1, ...`` of its chunk: the log-softmax of the raw
logits there (no temperature, as vLLM's prompt logprobs), the logprob and rank of the prompt token that follows,
and the top N. Every other row keeps the usual path (logits of its last position only, when it samples).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from nanocore.runner.host_transfer import HostCopy
from nanocore.runner.step_plan import ScheduledRow

#: float32 logits of this many positions at a time: 1024 x a 150k vocabulary is 600 MB, whatever the chunk length
LOGITS_ROWS_PER_SLICE = 1024


@dataclass
class PromptRows:
    """The step's prompt positions to score, in batch order."""

    rows: list[int]  # batch indices of the rows that score some
    indices: torch.Tensor  # [T] their positions' indices in the step's hidden states
    targets: torch.Tensor  # [T] the prompt token that follows each
    top_n: int  # the most top logprobs a row asks for


def prompt_positions(rows: list[ScheduledRow], cu_seqlens: np.ndarray) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(row indices, hidden-state indices, target ids) of the rows with ``prompt_targets``; host arrays."""
    scoring = [i for i, r in enumerate(rows) if r.prompt_targets is not None]
    if not scoring:
        return scoring, np.zeros(0, np.int64), np.zeros(0, np.int64)
    counts = [len(rows[i].prompt_targets) for i in scoring]
    indices = np.concatenate([np.arange(n, dtype=np.int64) + cu_seqlens[i] for i, n in zip(scoring, counts)])
    targets = np.fromiter(itertools.chain.from_iterable(rows[i].prompt_targets for i in scoring), np.int64,
                          len(indices))
    return scoring, indices, targets


def score_prompts(model, hidden: torch.Tensor, prompt: PromptRows, keep: bool) -> tuple[torch.Tensor, ...] | None:
    """(ids, logprobs, ranks) of every position: ``[T, 1 + top_n]`` with the target first, ranks ``[T]``.

    ``keep``: False on ranks that do not sample; they still compute the logits (a collective under tensor
    parallelism) and return None."""
    parts = []
    for begin in range(0, prompt.indices.shape[0], LOGITS_ROWS_PER_SLICE):
        index = prompt.indices[begin:begin + LOGITS_ROWS_PER_SLICE]
        logits = model.compute_logits(hidden.index_select(0, index))
        if keep:
            parts.append(_logprobs(logits, prompt.targets[begin:begin + LOGITS_ROWS_PER_SLICE], prompt.top_n))
    if not keep:
        return None
    return tuple(torch.cat(columns) for columns in zip(*parts))


def _logprobs(logits: torch.Tensor, targets: torch.Tensor, top_n: int) -> tuple[torch.Tensor, ...]:
    logprobs = logits.float().log_softmax(dim=-1)
    target = logprobs.gather(1, targets.unsqueeze(1))
    ranks = (logprobs > target).sum(dim=-1) + 1
    top_lp, top_ids = logprobs.topk(min(top_n, logprobs.shape[-1]), dim=-1)
    return torch.cat([targets.unsqueeze(1), top_ids], dim=1), torch.cat([target, top_lp], dim=1), ranks


class PendingPromptLogprobs:
    """A step's prompt logprobs queued on the device; ``result()`` splits them per sequence on the host."""

    def __init__(self, rows: list[ScheduledRow], scored: tuple[torch.Tensor, ...]):
        self.rows = rows
        self.copies = tuple(HostCopy(t) for t in scored)

    def result(self) -> dict[int, list[tuple[list[int], list[float], int]]]:
        ids, lps, ranks = (copy.tolist() for copy in self.copies)
        out, begin = {}, 0
        for row in self.rows:
            end, keep = begin + len(row.prompt_targets), 1 + row.num_prompt_logprobs
            out[row.seq_id] = [(ids[i][:keep], lps[i][:keep], ranks[i]) for i in range(begin, end)]
            begin = end
        return out
