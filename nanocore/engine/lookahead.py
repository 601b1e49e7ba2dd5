"""Async scheduling: queue the next decode step's forward before this step's sampled ids reach the host.

At step j the engine queues j's logits and sampling, then, for a plain decode batch that will run again
unchanged, the forward of step j+1 fed by j's samples on the device; only then does it wait for j's ids
and post-process them (stop checks, frees, prefix publishing) while the device runs j+1's forward. At
step j+1 the scheduler runs as usual; if it picks exactly the look-ahead's rows that are still running
(a row finished at j was one wasted token), only logits and sampling remain to queue, on exactly the
synchronous batch, so random streams and outputs are the synchronous engine's. Anything else (an
admission, a different batch) throws the look-ahead away and runs the step synchronously.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.scheduler import ScheduledBatch, Scheduler
from nanocore.engine.sequence import Sequence, SequenceStatus

RUNNING = SequenceStatus.RUNNING


@dataclass
class Lookahead:
    """A decode forward queued before its input ids were known on the host."""

    seqs: list[Sequence]
    positions: list[int]  # the position each row computes (its sequence's num_tokens at launch)
    hidden: torch.Tensor  # [len(seqs), hidden]
    grown: list[tuple[Sequence, int]]  # sequences given a block for it, with their block count before

    def rows_for(self, batch: ScheduledBatch) -> list[int] | None:
        """The rows that are exactly ``batch`` (its running sequences, in order, one token each), or None."""
        if batch.total_tokens != len(batch.seqs):
            return None
        keep = [i for i, s in enumerate(self.seqs) if s.status is RUNNING]
        if len(keep) != len(batch.seqs):
            return None
        seqs, positions = self.seqs, self.positions
        for i, seq in zip(keep, batch.seqs):
            if seqs[i] is not seq or positions[i] != seq.num_computed_tokens:
                return None
        return keep

    def undo_blocks(self, block_manager: BlockManager) -> None:
        """Give back the blocks allocated for it, so the scheduler sees the synchronous engine's free blocks."""
        for seq, num_blocks in self.grown:
            if seq.status is RUNNING:
                block_manager.trim(seq, num_blocks)


def lookahead_rows(batch: ScheduledBatch, scheduler: Scheduler, max_model_len: int) -> list[int] | None:
    """Rows of ``batch`` worth a look-ahead step, or None when the next step may differ from it.

    The batch must be every running sequence decoding one token and nothing waiting for admission. Rows
    that need the host after each step (logprobs, a detokenizer for stop strings or streaming) are fine:
    their post-processing of step j runs while the device computes j+1, and a row that stops at j (stop
    string, like EOS) costs one wasted token. Rows that finish by length at this step are left out; the
    blocks the rest need must be free without evicting cached ones. Cheap checks first: this runs on
    every decode step.
    """
    if scheduler.waiting or len(batch.seqs) != len(scheduler.running) or batch.total_tokens != len(batch.seqs):
        return None
    rows, needed = [], 0
    block_manager = scheduler.block_manager
    for i, seq in enumerate(batch.seqs):
        num_tokens = seq.num_tokens
        if seq.num_computed_tokens + 1 != num_tokens:
            return None
        if seq.reaches_length(num_tokens + 1, max_model_len):
            continue  # finishes at this step: nothing to look ahead for
        rows.append(i)
        needed += block_manager.blocks_needed(seq, num_tokens + 1)
    if not rows or needed > len(block_manager.free_blocks):
        return None
    return rows


def allocate_lookahead(block_manager: BlockManager, seqs: list[Sequence]) -> list[tuple[Sequence, int]]:
    """Blocks for each sequence's next position (checked free by ``lookahead_rows``); returns the grown ones."""
    grown = []
    for seq in seqs:
        if block_manager.blocks_needed(seq, seq.num_tokens + 1):
            before = seq.num_blocks
            ok = block_manager.allocate(seq, seq.num_tokens + 1)
            assert ok, "lookahead_rows counted free blocks that allocate() could not take"
            grown.append((seq, before))
    return grown
