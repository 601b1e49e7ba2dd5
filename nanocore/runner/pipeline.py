"""Pipeline parallelism inside one step: the plan's rows cut into micro-batches that flow through the stages.

Every rank gets the whole plan (the scheduler and the plan broadcast are unchanged). Stage ``s`` runs micro-batch
``i``'s layers once stage ``s - 1`` has sent its hidden states and residual (their shapes follow from the plan: no
size message), and sends its own on without waiting, so while stage 1 runs micro-batch 0 stage 0 runs micro-batch
1 (GPipe inside a step; the stages' fill and drain is the bubble). The last stage computes the logits of every
sampled row of the step at once (so sampling draws as one rank would), its first rank samples and sends the
``StepOutput`` to rank 0 as a typed message (``wire.encode_step_output``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.distributed as dist

from nanocore.config import EngineConfig
from nanocore.distributed.pipeline import StagePeers, recv_bytes, recv_tensors, send_bytes, send_tensors
from nanocore.runner.inputs import InputBuilder, StepInputs
from nanocore.runner.model_runner import ModelRunner, PendingOutput
from nanocore.runner.prompt_logprobs import PendingPromptLogprobs, score_prompts
from nanocore.runner.step_plan import ScheduledRow, StepOutput, StepPlan
from nanocore.runner.wire import decode_step_output, encode_step_output


def micro_batches(rows: list[ScheduledRow], count: int) -> list[list[ScheduledRow]]:
    """``rows`` cut into ``min(count, len(rows))`` contiguous pieces of about equal tokens, none empty."""
    count = min(count, len(rows))
    if count <= 1:
        return [rows]
    ends = np.cumsum([len(r.token_ids) for r in rows])
    cuts = [0]
    for k in range(1, count):
        cut = int(np.searchsorted(ends, ends[-1] * k / count)) + 1  # the row that reaches k/count of the tokens
        cuts.append(min(max(cut, cuts[-1] + 1), len(rows) - (count - k)))
    cuts.append(len(rows))
    return [rows[a:b] for a, b in zip(cuts, cuts[1:])]


def pipeline_stage(runner: ModelRunner, config: EngineConfig) -> PipelineStage | None:
    """This rank's stage when the engine is pipelined (the process group is up), else None."""
    if config.pipeline_parallel_size == 1:
        return None
    width = dist.get_world_size() // config.pipeline_parallel_size
    return PipelineStage(runner, StagePeers(dist.get_rank(), width, config.pipeline_parallel_size))


@dataclasses.dataclass
class _LastStageRows:
    """What the last stage keeps of one micro-batch for the step's sampling."""

    rows: list[ScheduledRow]  # the rows that sample
    hidden: torch.Tensor  # their final hidden states
    prompt: PendingPromptLogprobs | None


class PipelineStage:
    """One rank's part of each step under pipeline parallelism, with ModelRunner's ``execute`` / ``prompt_logits``:
    on rank 0 they return what a single rank would; on the other ranks, None."""

    def __init__(self, runner: ModelRunner, peers: StagePeers):
        self.runner, self.peers = runner, peers
        self.model = runner.model
        self.hidden_size = runner.model.config.hidden_size
        self.is_sampler = peers.rank == peers.sampler
        inputs = runner.inputs  # one builder per micro-batch slot: each keeps its rows' block tables between steps
        self.builders = [InputBuilder(inputs.block_size, inputs.tables.max_blocks_per_seq, inputs.device,
                                      inputs.decode_order) for _ in range(peers.pp_size)]

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput | None:
        runner, peers = self.runner, self.peers
        runner.sampling.drop(plan.finished_seq_ids)
        if plan.reset_seq_ids:
            for builder in self.builders:
                builder.tables.forget(plan.reset_seq_ids)
        sends, kept = [], []
        for builder, rows in zip(self.builders, micro_batches(plan.rows, peers.pp_size)):
            inputs = builder.prepare(StepPlan(rows), runner.kv_caches, runner.codec)
            out = self._forward(inputs, inputs.meta)
            if peers.is_last:
                kept.append(self._keep(rows, inputs, out))
            else:
                sends.append((out, send_tensors(list(out), peers.next)))  # waited for after the last micro-batch
        for _, works in sends:
            for work in works:
                work.wait()
        if self.is_sampler:
            send_bytes(encode_step_output(self._sample(kept)), 0, runner.device)
        elif peers.is_last:
            self._sample(kept)  # the LM head's all-gather needs every rank of the stage
        if peers.rank == 0:
            return decode_step_output(recv_bytes(peers.sampler, runner.device))
        return None

    @torch.inference_mode()
    def prompt_logits(self, row: ScheduledRow, kv_from_cache: bool = False) -> torch.Tensor | None:
        """Rank 0 gets the float32 logits ``[len(row.token_ids), vocab]`` from the sampling rank."""
        runner, peers = self.runner, self.peers
        inputs = runner.prepare(StepPlan([row]), all_logits=True)
        meta = dataclasses.replace(inputs.meta, kv_from_cache=kv_from_cache, launch_choices={})  # a fresh memo
        out = self._forward(inputs, meta)
        if not peers.is_last:
            for work in send_tensors(list(out), peers.next):
                work.wait()
        else:
            logits = self.model.compute_logits(out).float()  # evaluation scores in float32
            if self.is_sampler:
                for work in send_tensors([logits], 0):
                    work.wait()
        if peers.rank == 0:
            shape = (len(row.token_ids), self.model.config.vocab_size)
            return recv_tensors([shape], torch.float32, runner.device, peers.sampler)[0]
        return None

    def _forward(self, inputs: StepInputs, meta):
        """This stage's layers on one micro-batch; a later stage first receives its predecessor's output."""
        carried = None
        if not self.peers.is_first:
            shape = (inputs.input_ids.shape[0], self.hidden_size)
            carried = tuple(recv_tensors([shape, shape], self.runner.dtype, self.runner.device, self.peers.prev))
        return self.model.forward(inputs.input_ids, inputs.positions, meta, carried)

    def _keep(self, rows: list[ScheduledRow], inputs: StepInputs, hidden: torch.Tensor) -> _LastStageRows:
        prompt = None
        if inputs.prompt is not None:
            scored = score_prompts(self.model, hidden, inputs.prompt, self.is_sampler)
            if scored is not None:
                prompt = PendingPromptLogprobs([rows[i] for i in inputs.prompt.rows], scored)
        sampled = [rows[i] for i in inputs.sample_rows]
        if len(sampled) < len(rows) or inputs.meta.max_query_len > 1:
            hidden = hidden[inputs.logits_indices]
        return _LastStageRows(sampled, hidden, prompt)

    def _sample(self, kept: list[_LastStageRows]) -> StepOutput:
        """The step's samples from every micro-batch's sampled rows at once (the sampling rank's answer)."""
        rows = [row for part in kept for row in part.rows]
        prompts = [part.prompt.result() for part in kept if part.prompt is not None]
        prompt_logprobs = {seq: entries for scored in prompts for seq, entries in scored.items()} if prompts else None
        if not rows:
            return StepOutput([], [], prompt_logprobs=prompt_logprobs)
        logits = self.model.compute_logits(torch.cat([part.hidden for part in kept]))
        if not self.is_sampler:
            return StepOutput([], [])
        output = PendingOutput(rows, self.runner.sampler(logits, self.runner.sampling.tensors(rows))).result()
        return dataclasses.replace(output, prompt_logprobs=prompt_logprobs)
