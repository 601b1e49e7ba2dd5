"""Rank 0's side of tensor / expert parallelism: start the workers, send each plan, surface failures, stop.

``MultiprocExecutor`` spawns ranks 1..N-1 (``nanocore.runner.worker_process.worker_main``) and moves through the
same stages they do (validated -> process group -> loaded -> KV blocks agreed -> ready), waiting on each with a
liveness check and a timeout (``NANOCORE_DIST_TIMEOUT_S``, default 600), so a worker that dies is a
``WorkerError`` with its traceback, never a hang. Each step it sends the plan to the workers, then runs rank 0's
own ModelRunner on it, which samples.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nanocore.config import EngineConfig
from nanocore.distributed import abandon_process_group, destroy_distributed
from nanocore.runner import worker_process
from nanocore.plugins import build_backend
from nanocore.runner.executor import Executor
from nanocore.runner.model_runner import ModelRunner
from nanocore.runner.pipeline import pipeline_stage
from nanocore.runner.parallel_checks import check_parallel_config
from nanocore.runner.step_plan import ScheduledRow, StepOutput, StepPlan, encode_plan
from nanocore.runner.wire import WORKER_REPLIES, MalformedMessage, decode_message, encode_message
from nanocore.runner.worker_process import (NVLS_OFF, SPAWN_HINT, WorkerError, agreed_runner_config, backend_names,
                                     dist_timeout, join_process_group, rank_device, trace, worker_main,
                                     world_size_of)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    """Ranks 1..N-1 of one engine as spawned worker processes, seen from rank 0."""

    def __init__(self, config: EngineConfig, device: torch.device):
        check_parallel_config(config)
        super().__init__(config, device)
        self.world_size = world_size_of(config)
        rank_device(device, self.world_size - 1)  # every GPU we will need is visible
        os.environ.update(NVLS_OFF)  # for this process's NCCL and inherited by the workers
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self.procs: list = []
        self.conns: list = []
        self.worker_num_blocks: list[int] = []
        self.worker_backends: list[dict] = []  # each worker's backend_names(), in rank order
        self._state = {"serving": False, "broken": None, "own_group": False}  # shared with the finalizer, which must not hold self
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns, self._state)
        ctx = mp.get_context("spawn")
        with self._closing_on_error():
            for rank in range(1, self.world_size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=worker_main, name=f"nanocore-rank{rank}", daemon=True,
                                   args=(rank, self.world_size, config.model_dump(), init_method,
                                         str(rank_device(device, rank)), child, os.getpid()))
                proc.start()
                child.close()  # so a dead worker reads as EOF here
                self.procs.append(proc)
                self.conns.append(parent)
            self._wait("validated", "while loading plugins and checking the config")
            self.parallel = join_process_group(0, self.world_size, config, rank_device(device, 0), init_method)
            self._state["own_group"] = True
            trace(0, "joined the process group")

    # ---- start-up stages --------------------------------------------------------------------------
    def load_model(self):
        from nanocore.loader import load_model

        with self._closing_on_error():
            return load_model(self.config, self.device, self.parallel)

    def start(self, loaded, max_model_len: int) -> None:
        """Rank 0's ModelRunner, built alongside the workers' with the KV block count they all agreed on."""
        with self._closing_on_error():
            codec = build_backend("kv_codec", self.config, self.device)
            self._wait("loaded", "while loading the model")
            config = agreed_runner_config(self.config, loaded, self.device, codec, max_model_len)
            trace(0, f"agreed on {config.num_kv_blocks} KV blocks")
            runner = ModelRunner(config, loaded, self.device, codec, max_model_len)
            ready = list(self._wait("ready", "while building its KV cache").values())
            self.worker_num_blocks = [num_blocks for num_blocks, _ in ready]
            self.worker_backends = [backends for _, backends in ready]
            assert all(n == runner.num_blocks for n in self.worker_num_blocks), (runner.num_blocks, self.worker_num_blocks)
            mine = backend_names(loaded, codec)
            if any(b != mine for b in self.worker_backends):  # plugins resolve per process: "auto" could differ
                raise WorkerError(f"the workers resolved other backends than rank 0 ({mine}): {self.worker_backends}; "
                                  f"name the backends explicitly instead of 'auto'")
        self._state["serving"] = True
        self.runner = runner
        self.stepper = pipeline_stage(runner, self.config) or runner  # what runs each step on this rank

    # ---- each step -----------------------------------------------------------------------------
    def launch(self, plan: StepPlan) -> "Done":
        """Every rank runs ``plan`` (the workers first: the collectives pair up); rank 0 samples."""
        assert plan.ahead_rows is None, "worker ranks never run a look-ahead: rank 0 would skip a forward they run"
        self.send("execute", encode_plan(plan))
        with self.running_step():
            return Done(self.stepper.execute(plan))

    def prompt_logits(self, row: ScheduledRow, kv_from_cache: bool = False) -> torch.Tensor:
        self.send("prompt_logits", encode_plan(StepPlan([row])), kv_from_cache)  # every rank attends the same way
        with self.running_step():
            return self.stepper.prompt_logits(row, kv_from_cache)

    def send(self, method: str, *args) -> None:
        """Ask every worker to run ``method(*args)`` (no reply: the collectives keep us in step)."""
        if self._state["broken"]:
            raise WorkerError(self._state["broken"])
        self.raise_if_failed()
        if worker_process.TRACING:  # every step: no message built when off
            trace(0, f"call {method}")
        data = encode_message(method, *args)
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as exc:
            self.raise_if_failed(grace_s=1.0)
            raise WorkerError(f"could not reach a worker ({exc}); close this LLM and build a new one") from exc

    @contextlib.contextmanager
    def running_step(self):
        """Rank 0's half of a step; a failure here leaves the ranks out of step for good."""
        try:
            yield
        except BaseException as exc:
            self._state["broken"] = "an earlier step failed part-way, so the ranks are out of step; close this LLM " \
                                    "and build a new one"
            if isinstance(exc, Exception) and not isinstance(exc, WorkerError):  # not on Ctrl-C: no waiting
                self.raise_if_failed(grace_s=2.0, cause=exc)
            raise

    def raise_if_failed(self, grace_s: float = 0.0, cause: BaseException | None = None) -> None:
        """A WorkerError for the first worker that reported an error or exited (waiting ``grace_s`` for one)."""
        deadline = time.monotonic() + grace_s
        while True:
            for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
                problem = self._problem(rank, proc, conn, "while running a step")
                if problem:
                    self._state["broken"] = problem
                    raise WorkerError(problem) from cause
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the workers and leave the process group (idempotent; also run at GC and at exit)."""
        self._finalizer()

    # ---- helpers -------------------------------------------------------------------------------
    def _wait(self, stage: str, doing: str) -> dict[int, object]:
        """Each worker's reply for ``stage``, in rank order; WorkerError if one fails, dies or times out."""
        deadline = time.monotonic() + dist_timeout().total_seconds()
        replies: dict[int, object] = {}
        while len(replies) < len(self.procs):
            for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
                if rank in replies:
                    continue
                alive = proc.is_alive()  # before poll: a worker that dies after replying still counts
                if conn.poll(0.02):
                    kind, value = _recv(conn)
                    if kind == "error":
                        raise WorkerError(_describe(rank, doing, value, proc))
                    assert kind == stage, (kind, stage)
                    replies[rank] = value
                elif not alive:
                    raise WorkerError(_describe(rank, doing, None, proc))
            if time.monotonic() > deadline:
                missing = [r for r in range(1, len(self.procs) + 1) if r not in replies]
                raise WorkerError(f"worker rank(s) {missing} did not finish {stage!r} within "
                                  f"{dist_timeout().total_seconds():.0f} s; raise NANOCORE_DIST_TIMEOUT_S if "
                                  f"loading is just slow")
        return dict(sorted(replies.items()))

    def _problem(self, rank: int, proc, conn, doing: str) -> str | None:
        alive = proc.is_alive()
        if conn.poll(0):
            kind, value = _recv(conn)
            if kind == "error":
                return _describe(rank, doing, value, proc)
        if not alive:
            return _describe(rank, doing, None, proc)
        return None


class Done:
    """A step already run to its end (the ranks run synchronously)."""

    def __init__(self, output: StepOutput):
        self.output = output

    def result(self) -> StepOutput:
        return self.output


def _recv(conn) -> tuple[str, object]:
    """(stage, its value) of a worker's next reply: a typed message (``wire``), never unpickled."""
    try:
        kind, values = decode_message(conn.recv_bytes(), WORKER_REPLIES)
    except (EOFError, OSError):
        return "error", None
    except MalformedMessage as exc:
        return "error", (str(exc), "")
    return kind, (values[0] if len(values) == 1 else values or None)


def _describe(rank: int, doing: str, error: tuple[str, str] | None, proc) -> str:
    """``error``: the worker's (summary, traceback), or None when it died without a word."""
    head = f"tensor/expert-parallel worker rank {rank} failed {doing}"
    if error:
        summary, tb = error
        return f"{head}: {summary}\n--- worker traceback ---\n{tb.rstrip()}"
    proc.join(timeout=1.0)  # its pipe closes a moment before its exit code is known
    code = proc.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return f"{head}: it exited ({how}) without reporting an error; if killed, check memory. Note: {SPAWN_HINT}"


def _shutdown(procs: list, conns: list, state: dict) -> None:
    """Tell idle workers to exit and leave the group together; otherwise end them, then abandon the group."""
    clean = state["serving"] and not state["broken"] and all(p.is_alive() for p in procs)
    trace(0, f"shutting down ({'clean' if clean else 'terminating the workers'})")
    if clean:
        try:
            for conn in conns:
                conn.send_bytes(encode_message("exit"))
        except OSError:
            clean = False
    if not clean:
        _end_workers(procs, grace_s=0.2)  # first: an NCCL group left while peers still run can wait on them
    if state["own_group"] and dist.is_initialized():
        if clean:
            left = False
            with contextlib.suppress(RuntimeError):  # NCCL: every rank at once; gloo: workers first, rank 0 last
                left = destroy_distributed(peers_exited=lambda: sum(not p.is_alive() for p in procs))
            trace(0, "left the process group" if left else "teardown cut short")
        if dist.is_initialized():  # a broken group, or a clean teardown cut short: end the workers, then abort
            _end_workers(procs, grace_s=0.2)
            abandon_process_group()
        state["own_group"] = False
    _end_workers(procs, grace_s=10 if clean else 0.2)
    for conn in conns:
        conn.close()
    state["serving"] = False


def _end_workers(procs: list, grace_s: float) -> None:
    for proc in procs:
        proc.join(timeout=grace_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():  # SIGTERM can wait behind a stuck collective
            proc.kill()
            proc.join(timeout=5)
