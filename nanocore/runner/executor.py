"""Executors: how the ranks of one engine run. The engine sees only this seam.

An executor loads the model, starts a ``ModelRunner`` on every rank with one KV block count, runs each
``StepPlan`` on every rank (rank 0, in this process, samples) and stops the ranks. ``LocalExecutor`` is one rank in
this process; ``multiproc_executor.MultiprocExecutor`` spawns ranks 1..N-1 as worker processes for tensor /
expert parallelism. A launcher that starts ranks on other hosts plugs in as another ``Executor``.
"""
from __future__ import annotations

import contextlib

import torch

from nanocore.config import EngineConfig
from nanocore.plugins import build_backend
from nanocore.runner.model_runner import ModelRunner, PendingOutput
from nanocore.runner.step_plan import AheadPlan, ScheduledRow, StepOutput, StepPlan


class Executor:
    """The ranks of one engine, seen from rank 0. ``runner`` is rank 0's ModelRunner once ``start`` ran."""

    #: whether ``launch_ahead`` may queue the next decode step before this one's samples are read
    overlaps_steps = False
    runner: ModelRunner

    def __init__(self, config: EngineConfig, device: torch.device):
        self.config, self.device = config, device

    def load_model(self):
        """Rank 0's LoadedModel (every rank loads its own shard)."""
        raise NotImplementedError

    def start(self, loaded, max_model_len: int) -> None:
        """Build the KV cache and the ModelRunner on every rank, with one block count for all."""
        raise NotImplementedError

    @property
    def num_blocks(self) -> int:
        return self.runner.num_blocks

    def launch(self, plan: StepPlan) -> PendingOutput:
        """Queue ``plan`` on every rank; ``.result()`` of the answer waits for rank 0's samples."""
        raise NotImplementedError

    def execute(self, plan: StepPlan) -> StepOutput:
        return self.launch(plan).result()

    def launch_ahead(self, ahead: AheadPlan, pending: PendingOutput) -> None:
        """Queue the decode step after ``pending``'s, fed by its samples on the device (``overlaps_steps`` only)."""
        raise NotImplementedError(f"{type(self).__name__} runs every step synchronously")

    def prompt_logits(self, row: ScheduledRow, kv_from_cache: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the other ranks (idempotent)."""

    @contextlib.contextmanager
    def _closing_on_error(self):
        """Start-up of an executor with other ranks: any failure closes what was started, then propagates."""
        try:
            yield
        except BaseException:
            self.close()
            raise


class LocalExecutor(Executor):
    """One rank, in this process."""

    #: on CUDA the forward runs while the host goes on; on CPU the engine keeps it off (nothing to overlap)
    overlaps_steps = True

    def load_model(self):
        from nanocore.distributed.parallel import ParallelContext
        from nanocore.loader import load_model

        return load_model(self.config, self.device, ParallelContext())

    def start(self, loaded, max_model_len: int) -> None:
        codec = build_backend("kv_codec", self.config, self.device)
        self.runner = ModelRunner(self.config, loaded, self.device, codec, max_model_len)

    def launch(self, plan: StepPlan) -> PendingOutput:
        return self.runner.launch(plan)

    def launch_ahead(self, ahead: AheadPlan, pending: PendingOutput) -> None:
        self.runner.launch_ahead(ahead, pending.token_ids)

    def prompt_logits(self, row: ScheduledRow, kv_from_cache: bool = False) -> torch.Tensor:
        return self.runner.prompt_logits(row, kv_from_cache)
