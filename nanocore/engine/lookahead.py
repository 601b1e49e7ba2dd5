"""Async scheduling: plan the next decode step before this step's sampled ids reach the host.

At step j the engine queues j's plan; then, for a plain decode batch that will run again unchanged, the
scheduler plans step j+1's decode forward (an ``AheadPlan``: each row's next position, its block allocated
here) and the runner queues it, fed by j's samples on the device. Only then does the engine read j's ids and
update (stop checks, frees, prefix publishing) while the device runs j+1's forward. At step j+1 the policy
decides as usual, once; if it picks exactly the look-ahead's rows that are still running (a row finished at j
was one wasted token), the plan says so and only logits and sampling remain to queue, on exactly the
synchronous batch, so random streams and outputs are the synchronous engine's. Anything else (an admission, a
different batch) throws the look-ahead away and runs the step synchronously.
"""
from __future__ import annotations

from dataclasses import dataclass

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.sequence import Sequence, SequenceStatus
from nanocore.runner.step_plan import AheadPlan

RUNNING = SequenceStatus.RUNNING


@dataclass
class Lookahead:
    """A decode step planned before its input ids were known on the host."""

    seqs: list[Sequence]
    positions: list[int]  # the position each row computes (its sequence's num_tokens when planned)
    grown: list[tuple[Sequence, int]]  # sequences given a block for it, with their block count before

    def rows_for(self, batch_seqs: list[Sequence], num_tokens: int) -> list[int] | None:
        """The rows that are exactly the batch (its running sequences, in order, one token each), or None."""
        if num_tokens != len(batch_seqs):
            return None
        keep = [i for i, s in enumerate(self.seqs) if s.status is RUNNING]
        if len(keep) != len(batch_seqs):
            return None
        seqs, positions = self.seqs, self.positions
        for i, seq in zip(keep, batch_seqs):
            if seqs[i] is not seq or positions[i] != seq.num_computed_tokens:
                return None
        return keep

    def undo_blocks(self, block_manager: BlockManager) -> list[int]:
        """Give back the blocks allocated for it, so the scheduler sees the synchronous engine's free blocks;
        returns the ids of the sequences whose tables were cut."""
        cut = []
        for seq, num_blocks in self.grown:
            if seq.status is RUNNING:
                block_manager.trim(seq, num_blocks)
                cut.append(seq.seq_id)
        return cut


def lookahead_rows(batch_seqs: list[Sequence], num_tokens: int, waiting, running: list[Sequence],
                   block_manager: BlockManager, max_model_len: int) -> list[int] | None:
    """Rows of the batch worth a look-ahead step, or None when the next step may differ from it.

    The batch must be every running sequence decoding one token and nothing waiting for admission. Rows
    that need the host after each step (logprobs, a detokenizer for stop strings or streaming) are fine:
    their update for step j runs while the device computes j+1, and a row that stops at j (stop string,
    like EOS) costs one wasted token. Rows that finish by length at this step are left out; the blocks the
    rest need must be free without evicting cached ones. Cheap checks first: this runs on every decode step.
    """
    if waiting or len(batch_seqs) != len(running) or num_tokens != len(batch_seqs):
        return None
    rows, needed = [], 0
    for i, seq in enumerate(batch_seqs):
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


def plan_lookahead(batch_seqs: list[Sequence], rows: list[int],
                   block_manager: BlockManager) -> tuple[Lookahead, AheadPlan]:
    """Allocate each row's next position (checked free by ``lookahead_rows``) and plan its forward."""
    seqs = batch_seqs if len(rows) == len(batch_seqs) else [batch_seqs[i] for i in rows]
    grown = []
    for seq in seqs:
        if block_manager.blocks_needed(seq, seq.num_tokens + 1):
            before = seq.num_blocks
            ok = block_manager.allocate(seq, seq.num_tokens + 1)
            assert ok, "lookahead_rows counted free blocks that allocate() could not take"
            grown.append((seq, before))
    positions = [s.num_tokens for s in seqs]
    plan = AheadPlan([s.seq_id for s in seqs], positions, [s.block_table for s in seqs],
                     None if seqs is batch_seqs else rows)
    return Lookahead(seqs, positions, grown), plan
