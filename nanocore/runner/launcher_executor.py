"""Ranks started by a launcher (``torchrun``), possibly on several hosts: rank 0 is the engine, the rest mirror it.

``launcher_executor`` is called where the engine builds its executor. On rank 0 it returns a ``TorchrunExecutor``;
on every other rank it runs the worker loop (``launcher_worker``) and ends the process when rank 0 shuts down, so
the command that built the engine never goes on there. The ranks use the launcher's ``env://`` process group, each
on ``cuda:LOCAL_RANK`` (NCCL) or the CPU (gloo). Each step rank 0 broadcasts the plan as a typed ``wire`` message (in
a uint8 tensor) over a gloo group of its own; a heartbeat on the rendezvous store ends every rank with a
clear error when one goes silent.
"""
from __future__ import annotations

import contextlib
import sys
import time
import weakref

import torch
import torch.distributed as dist

from nanocore.config import EngineConfig
from nanocore.distributed import abandon_process_group, destroy_distributed, exit_worker_process
from nanocore.distributed.channel import broadcast_bytes
from nanocore.distributed.launcher import LaunchedRank
from nanocore.plugins import build_backend
from nanocore.runner.executor import Executor
from nanocore.runner.model_runner import ModelRunner
from nanocore.runner.pipeline import pipeline_stage
from nanocore.runner.launcher_worker import check_ranks_agree, join_ranks, run_worker_rank
from nanocore.runner.multiproc_executor import Done
from nanocore.runner.parallel_checks import check_parallel_config, check_world_size
from nanocore.runner.step_plan import ScheduledRow, StepPlan, encode_plan
from nanocore.runner.wire import encode_message
from nanocore.runner.worker_process import WorkerError, agreed_runner_config, backend_names, trace

#: seconds the heartbeat's failure report waits for rank 0's main thread to raise WorkerError itself
EXIT_GRACE_S = 3.0
#: rank 0's engines in this process: the other ranks end with the first, so a second would wait for them in vain
_engines_started = [0]


def launcher_executor(config: EngineConfig, device: torch.device, launch: LaunchedRank) -> Executor:
    """Rank 0's executor; on any other rank this serves rank 0 and ends the process (it never returns)."""
    if _engines_started[0]:
        raise ValueError("under torchrun each launch runs one engine: the other ranks ended with the first one; "
                         "build one LLM per launch and start torchrun again for another")
    check_world_size(config, launch.world_size)  # the same on every rank: all fail together, before joining
    device = launch.device(device)
    if launch.rank == 0:
        _engines_started[0] += 1
        return TorchrunExecutor(config, device, launch)
    run_worker_rank(config, device, launch)  # ends the process


class TorchrunExecutor(Executor):
    """Rank 0 of an engine whose other ranks a launcher started (on this host or others)."""

    def __init__(self, config: EngineConfig, device: torch.device, launch: LaunchedRank):
        super().__init__(config, device)
        self.world_size = launch.world_size
        self._state = {"serving": False, "broken": None, "reported": False, "own_group": False, "group": None,
                       "heartbeat": None}  # shared with the finalizer and the heartbeat, which must not hold self
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        with self._closing_on_error():
            self.parallel, own, self.group, heartbeat = join_ranks(config, device, launch, self._failure_hook())
            self._state.update(own_group=own, group=self.group, heartbeat=heartbeat)
            self.heartbeat = heartbeat
            check_parallel_config(config)  # after joining: a rank whose host lacks the checkpoint tells the others

    def _failure_hook(self):
        state = self._state

        def on_failure(message: str) -> None:
            state["broken"] = message
            time.sleep(EXIT_GRACE_S)  # a step in progress raises WorkerError with this message meanwhile
            if not state["reported"]:
                print(f"nanocore rank 0: WorkerError: {message}; ending this rank", file=sys.stderr, flush=True)
            exit_worker_process(1)  # a collective with a dead peer may never return: no teardown

        return on_failure

    def load_model(self):
        from nanocore.loader import load_model

        with self._closing_on_error():
            return load_model(self.config, self.device, self.parallel)

    def start(self, loaded, max_model_len: int) -> None:
        with self._closing_on_error(), self.running_step():
            codec = build_backend("kv_codec", self.config, self.device)
            config = agreed_runner_config(self.config, loaded, self.device, codec, max_model_len)
            trace(0, f"agreed on {config.num_kv_blocks} KV blocks")
            runner = ModelRunner(config, loaded, self.device, codec, max_model_len)
            check_ranks_agree(runner.num_blocks, backend_names(loaded, codec), self.group)
        self._state["serving"] = True
        self.runner = runner
        self.stepper = pipeline_stage(runner, self.config) or runner  # what runs each step on this rank

    def launch(self, plan: StepPlan) -> Done:
        assert plan.ahead_rows is None, "worker ranks never run a look-ahead: rank 0 would skip a forward they run"
        with self.running_step():
            self.send("execute", encode_plan(plan))
            return Done(self.stepper.execute(plan))

    def prompt_logits(self, row: ScheduledRow, kv_from_cache: bool = False) -> torch.Tensor:
        with self.running_step():
            self.send("prompt_logits", encode_plan(StepPlan([row])), kv_from_cache)
            return self.stepper.prompt_logits(row, kv_from_cache)

    def send(self, method: str, *args) -> None:
        """Every worker rank runs ``method(*args)``: one broadcast of the typed message (no reply)."""
        broadcast_bytes(encode_message(method, *args), self.group)

    @contextlib.contextmanager
    def running_step(self):
        """Rank 0's half of a step: a peer's failure surfaces as WorkerError, and the ranks stay out of step."""
        if self._state["broken"]:
            raise WorkerError(self._state["broken"])
        try:
            yield
        except BaseException as exc:
            waits = isinstance(exc, Exception) and not isinstance(exc, WorkerError)  # not on Ctrl-C: no waiting
            problem = self._peer_problem() if waits else None
            self._state["broken"] = problem or ("an earlier step failed part-way, so the ranks are out of step; "
                                                "restart every rank")
            if problem:
                self._state["reported"] = True
                raise WorkerError(problem) from exc
            raise

    def _peer_problem(self) -> str | None:
        """A failed peer's story, waiting for the heartbeat's verdict (a killed peer shows only as silence)."""
        deadline = time.monotonic() + self.config.heartbeat_timeout_s * 1.5
        while time.monotonic() < deadline:
            problem = self._state["broken"] or self.heartbeat.peer_error()
            if problem:
                return problem
            time.sleep(0.05)
        return None

    def close(self) -> None:
        """Tell the worker ranks to exit and leave the process group together (idempotent; also at GC / exit)."""
        self._finalizer()


def _shutdown(state: dict) -> None:
    """Clean: the workers hear ``exit`` and all ranks leave the group together. Broken: leave it alone."""
    heartbeat, clean = state["heartbeat"], state["serving"] and not state["broken"]
    if heartbeat is not None:
        heartbeat.stop()  # ranks leave at different moments from here on
    trace(0, f"shutting down ({'clean' if clean else 'abandoning the group'})")
    if clean:
        try:
            broadcast_bytes(encode_message("exit"), state["group"])
        except RuntimeError:
            clean = False
    if state["own_group"] and dist.is_initialized():
        left = False
        if clean:
            with contextlib.suppress(RuntimeError):
                left = destroy_distributed()
        if not left and dist.is_initialized():
            abandon_process_group()
        state["own_group"] = False
    state["serving"] = False
