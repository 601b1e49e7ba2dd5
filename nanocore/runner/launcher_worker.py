"""Ranks 1..N-1 of a launcher-started engine: load this rank's shard, then run every plan rank 0 broadcasts.
Also the start every rank shares with rank 0 (``join_ranks``, ``check_ranks_agree``).

The process ends here, whatever happens: 0 once rank 0 said exit and the ranks left the group together, 1 with
the error on stderr (and posted to the other ranks through the store) when anything failed, a peer included.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from typing import NoReturn

import torch
import torch.distributed as dist

from nanocore.config import EngineConfig
from nanocore.distributed import destroy_distributed, exit_worker_process
from nanocore.distributed.channel import all_gather_bytes, broadcast_bytes, new_message_group
from nanocore.distributed.heartbeat import Heartbeat, post_error
from nanocore.distributed.launcher import LaunchedRank, join_launched_group
from nanocore.runner.parallel_checks import check_parallel_config
from nanocore.runner.worker_process import NVLS_OFF, Worker, WorkerError, dist_timeout, trace


def join_ranks(config: EngineConfig, device: torch.device, launch: LaunchedRank, on_failure):
    """Every rank's start, in the same order: process group, TP / EP groups, the message group, the heartbeat."""
    os.environ.update(NVLS_OFF)
    parallel, own_group = join_launched_group(launch, config.tensor_parallel_size, config.expert_parallel_size,
                                              device, dist_timeout(), config.pipeline_parallel_size)
    group = new_message_group()
    store = dist.distributed_c10d._get_default_store()
    heartbeat = Heartbeat(store, launch.rank, launch.world_size, config.heartbeat_timeout_s, on_failure).start()
    trace(launch.rank, "joined the process group")
    return parallel, own_group, group, heartbeat


def check_ranks_agree(num_blocks: int, backends: dict, group) -> None:
    """Every rank must hold the same KV blocks and run the backends rank 0 runs (plugins resolve per host)."""
    mine = json.dumps([num_blocks, backends], sort_keys=True).encode()
    reports = [json.loads(r) for r in all_gather_bytes(mine, group)]
    if any(r != reports[0] for r in reports):
        raise WorkerError(f"the ranks disagree on [KV blocks, backends]: {reports}; install the same plugins on every "
                          f"node and name the backends explicitly instead of 'auto'")


def run_worker_rank(config: EngineConfig, device: torch.device, launch: LaunchedRank) -> NoReturn:
    rank, heartbeat = launch.rank, None

    def on_failure(message: str) -> None:
        print(f"nanocore rank {rank}: {message}; ending this rank", file=sys.stderr, flush=True)
        exit_worker_process(1)  # a collective with a dead peer may never return: no teardown

    try:
        parallel, own_group, group, heartbeat = join_ranks(config, device, launch, on_failure)
        check_parallel_config(config)  # after joining, so rank 0 hears of a failure here
        worker = Worker(rank, config, device, parallel)
        check_ranks_agree(worker.runner.num_blocks, worker.backends, group)
        trace(rank, "serving rank 0")
        said_exit = worker.serve(lambda: _receive(group))
        heartbeat.stop()  # rank 0 leaves now; its silence is no failure
        if said_exit and own_group:
            destroy_distributed()  # together with rank 0, which returns last
    except BaseException as exc:
        peer = heartbeat.peer_error() if heartbeat is not None else None
        summary = f"{type(exc).__name__}: {exc}"
        if heartbeat is not None:
            heartbeat.stop()
        if dist.is_initialized():
            post_error(dist.distributed_c10d._get_default_store(), rank, summary)
        print(f"nanocore rank {rank} failed: {summary}" + (f"\n(first failure: {peer})" if peer else "") +
              f"\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        exit_worker_process(1)
    exit_worker_process(0)


def _receive(group) -> bytes:
    """Rank 0's next message; its loss is said as such (gloo only says a connection closed)."""
    try:
        return broadcast_bytes(None, group)
    except RuntimeError as exc:
        raise RuntimeError(f"lost rank 0 while waiting for its next call: it was killed or failed (see its log); "
                           f"{exc}") from exc

