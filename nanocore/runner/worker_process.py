"""Tensor / expert parallelism in the engine: rank 0 is the engine, ranks 1..N-1 mirror its forwards.

Nano-vLLM style. Each worker is a spawned process that loads plugins from entry points (the config
travels as a dict of names and options, never classes), joins the process group, loads its model
shard and builds its own ModelRunner and KV cache. Each step rank 0 sends the ``StepPlan`` as columns of
plain data (``encode_plan``, in a typed ``wire`` message, never pickle) through a pipe; every rank runs the same plan,
so the collectives inside the model pair up, and only rank 0 samples. Launcher ranks (``launcher_worker``) run the
same ``Worker`` with messages from a gloo broadcast instead of a pipe.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from nanocore.config import EngineConfig
from nanocore.distributed import ParallelContext, destroy_distributed, exit_worker_process, init_distributed, parallel
from nanocore.plugins import build_backend
from nanocore.runner.heap import frozen_heap
from nanocore.runner.kv_sizing import choose_num_kv_blocks, kv_bytes_per_block
from nanocore.runner.model_runner import ModelRunner
from nanocore.runner.pipeline import pipeline_stage
from nanocore.runner.step_plan import decode_plan
from nanocore.runner.wire import WORKER_CALLS, decode_message, encode_message

#: NVLink multicast stays off in every process we start (it breaks on the lent multi-GPU machines).
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT_ENV = "NANOCORE_DIST_TIMEOUT_S"
#: set to 1 to print every start-up stage and call of every rank (with ``kill -USR1 <pid>``: a stack dump)
TRACE_ENV = "NANOCORE_TRACE_WORKERS"
SPAWN_HINT = ("workers are spawned and re-import your main module: if your script builds the LLM at import "
              "time, put that code under `if __name__ == '__main__':`")


class WorkerError(RuntimeError):
    """A tensor / expert-parallel worker process failed; the message carries its error."""


def world_size_of(config: EngineConfig) -> int:
    """Processes for one engine: TP and EP groups overlap, so the larger size (the smaller must divide it), times
    the pipeline's stages."""
    tp, ep = config.tensor_parallel_size, config.expert_parallel_size
    if max(tp, ep) % min(tp, ep):
        raise ValueError(f"tensor_parallel_size {tp} and expert_parallel_size {ep} must divide one another "
                         f"(e.g. TP=2 with EP=2 or 4)")
    return max(tp, ep) * config.pipeline_parallel_size


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank ``r`` runs on ``cuda:(base + r)`` where ``cuda:base`` is the engine's device; CPU stays CPU."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"rank {rank} needs GPU cuda:{index} but only {torch.cuda.device_count()} are visible; "
                         f"lower tensor_parallel_size / expert_parallel_size or check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", index)


#: read once per process (spawned workers read it at their start): the per-step calls test only this flag
TRACING = os.environ.get(TRACE_ENV) == "1"


def trace(rank: int, what: str) -> None:
    """One line on stderr per stage / call when NANOCORE_TRACE_WORKERS=1 (for a hang on a multi-GPU machine)."""
    if TRACING:
        print(f"[nanocore rank {rank} {time.monotonic():.3f}] {what}", file=sys.stderr, flush=True)


def dist_timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "600")))


def join_process_group(rank: int, world_size: int, config: EngineConfig, device: torch.device,
                       init_method: str) -> ParallelContext:
    """Create the default group ourselves (for its timeout), then let ``init_distributed`` carve TP / EP."""
    if dist.is_initialized():
        if parallel.teardown_stuck:
            raise RuntimeError("an earlier tensor / expert-parallel engine in this process could not leave its "
                               "process group (see the warning it logged); start a new Python process")
        raise RuntimeError("a torch.distributed process group already exists in this process; nanocore starts "
                           "its own for tensor / expert parallelism, so destroy the other one first")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=dist_timeout())
    return init_distributed(rank, world_size, tp_size=config.tensor_parallel_size,
                            ep_size=config.expert_parallel_size, pp_size=config.pipeline_parallel_size,
                            device=device, init_method=init_method)


def min_over_ranks(value: int, device: torch.device) -> int:
    """The smallest ``value`` of all ranks (NCCL reduces on the GPU, gloo on the CPU)."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def local_num_kv_blocks(config: EngineConfig, loaded, device: torch.device, codec, max_model_len: int) -> int:
    """This rank's KV block budget, sized as ModelRunner sizes it (profiling on CUDA runs collectives)."""
    bytes_per_block = kv_bytes_per_block(codec, loaded.model.kv_cache_spec, loaded.dtype, config.block_size)
    return choose_num_kv_blocks(config, loaded.model, max_model_len, bytes_per_block, device)


def backend_names(loaded, codec) -> dict[str, str | None]:
    """The backends one rank's forward uses (every rank reports them: a worker must run what rank 0 runs)."""
    executor = loaded.moe_executor
    return {"linear_method": loaded.linear_method, "kv_codec": codec.name,
            "moe_executor": None if executor is None else executor.name}


def agreed_runner_config(config: EngineConfig, loaded, device: torch.device, codec, max_model_len: int) -> EngineConfig:
    """The config every rank builds its ModelRunner with: one KV block count (the minimum) for all ranks."""
    if config.pipeline_parallel_size > 1:  # a stage's forward waits on its neighbours: no graphs, no lone warm-up
        config = config.model_copy(update={"enforce_eager": True, "kernel_warmup": False})
    update = {}
    if config.num_kv_blocks is None:  # block ids are shared, so every rank must hold every block
        update["num_kv_blocks"] = min_over_ranks(local_num_kv_blocks(config, loaded, device, codec, max_model_len),
                                                 device)
    return config.model_copy(update=update)


# ---- the worker process ------------------------------------------------------------------------
def worker_main(rank: int, world_size: int, config_dict: dict, init_method: str, device_name: str, conn,
                parent_pid: int) -> None:
    """Entry point of ranks 1..N-1: validate, load, size the KV cache, then serve rank 0's calls."""
    try:
        os.environ.update(NVLS_OFF)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: where is it stuck
        trace(rank, f"started on {device_name}")
        exit_when_orphaned(parent_pid)
        if device_name == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the cores
        try:
            config = EngineConfig(**config_dict)  # validating the names loads the plugins here, from entry points
        except ValueError as exc:
            raise ValueError(f"{exc}\n(every worker loads plugins from entry points itself: install the plugin as a "
                             f"distribution and check NANOCORE_PLUGINS / NANOCORE_DISABLE_PLUGINS)") from exc
        report = _reporter(conn)
        report("validated")
        device = torch.device(device_name)
        parallel = join_process_group(rank, world_size, config, device, init_method)
        trace(rank, "joined the process group")
        if Worker(rank, config, device, parallel, report).serve(conn.recv_bytes):
            destroy_distributed()  # together with rank 0, which returns last (see destroy_distributed)
    except BaseException as exc:
        conn.send_bytes(encode_message("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        raise SystemExit(1)
    exit_worker_process(0)  # done and out of the group: skip teardown that can abort on leftover threads


def _reporter(conn):
    """A worker's start-up stages, to rank 0 through its pipe."""
    return lambda stage, *values: conn.send_bytes(encode_message(stage, *values))


def exit_when_orphaned(parent_pid: int, poll_s: float = 1.0) -> None:
    """End this worker once rank 0's process (``parent_pid``, passed in: it may die before we start) is gone,
    even while stuck in a collective: a killed engine must not leave a rank holding its GPU's memory."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="nanocore-orphan-watch", daemon=True).start()


class Worker:
    """One worker rank's ModelRunner: it runs each call rank 0 sends (``report``: start-up stages to rank 0)."""

    def __init__(self, rank: int, config: EngineConfig, device: torch.device, parallel: ParallelContext,
                 report=lambda stage, *values: None):
        from nanocore.loader import load_model

        self.rank = rank
        loaded = load_model(config, device, parallel)
        max_model_len = config.max_model_len or loaded.max_model_len
        codec = build_backend("kv_codec", config, device)
        report("loaded")
        trace(rank, "model loaded")
        runner_config = agreed_runner_config(config, loaded, device, codec, max_model_len)
        trace(rank, f"agreed on {runner_config.num_kv_blocks} KV blocks")
        self.runner = ModelRunner(runner_config, loaded, device, codec, max_model_len)
        self.runner.samples = False
        self.stepper = pipeline_stage(self.runner, config) or self.runner  # what runs each call
        self.backends = backend_names(loaded, codec)
        report("ready", self.runner.num_blocks, self.backends)
        trace(rank, "runner ready")

    def serve(self, receive) -> bool:
        """Run rank 0's calls (``receive()``: the next message's bytes) until it says exit (True) or is gone."""
        with frozen_heap(collect_first=True):  # as rank 0's loops: a full collection here would stall every step
            return self._serve(receive)

    def _serve(self, receive) -> bool:
        while True:
            try:
                method, args = decode_message(receive(), WORKER_CALLS)
            except EOFError:
                return False  # rank 0 is gone; the daemon flag and the group's timeout end us anyway
            if TRACING:  # every step: no message built when off
                trace(self.rank, f"call {method}")
            if method == "exit":
                return True
            getattr(self, method)(*args)

    def execute(self, plan: dict) -> None:
        self.stepper.execute(decode_plan(plan))

    def prompt_logits(self, plan: dict, kv_from_cache: bool = False) -> None:
        self.stepper.prompt_logits(decode_plan(plan).rows[0], bool(kv_from_cache))
