"""The scheduler's rows, with what scores a prompt: prompt logprobs per chunk, and prefill-only requests.

A sequence asking for prompt logprobs gets, in each prefill chunk, the prompt token that follows every position of
the chunk (``ScheduledRow.prompt_targets``); the runner returns their logprobs with the step's output and the
scheduler appends them to the sequence, chunk after chunk. The prefix cache serves only positions already scored,
so every needed position runs through the model. A request with ``max_tokens=0`` samples nothing: it ends after
its prefill.
"""
from __future__ import annotations

from nanocore.engine.sequence import Sequence
from nanocore.runner.step_plan import ScheduledRow


def scheduled_row(seq: Sequence, num_tokens: int) -> ScheduledRow:
    """``seq``'s next ``num_tokens`` tokens as a plan row (it samples when it reaches its newest token)."""
    start = seq.num_computed_tokens
    end = start + num_tokens
    row = ScheduledRow(seq.seq_id, start, seq.token_ids[start:end], seq.block_table,
                       end == seq.num_tokens and seq.max_tokens > 0, seq.num_tokens - seq.num_prompt_tokens,
                       seq.sampling)
    if seq.prompt_logprobs is not None:
        row.prompt_targets = prompt_targets(seq, start, end)
        row.num_prompt_logprobs = seq.sampling_params.prompt_logprobs
    return row


def prompt_targets(seq: Sequence, start: int, end: int) -> list[int] | None:
    """The prompt tokens after positions ``start, start + 1, ...`` of a chunk ``[start, end)``, while some of them
    are unscored (a recomputed chunk repeats the scored ones, which the scheduler skips); None when none is."""
    stop = min(end, seq.num_prompt_tokens - 1)
    if stop <= max(start, len(seq.prompt_logprobs)):
        return None
    return seq.token_ids[start + 1:stop + 1]


def cached_token_limit(seq: Sequence) -> int | None:
    """At most how many tokens the prefix cache may serve ``seq``: those whose logprobs it has (None: no limit)."""
    return len(seq.prompt_logprobs) if seq.scores_prompt else None


def ends_after_prefill(seq: Sequence, row: ScheduledRow) -> bool:
    """A prefill-only request (``max_tokens=0``) whose prompt is now computed: it finishes with reason "length"."""
    return not row.samples and seq.num_computed_tokens == seq.num_tokens
