"""Tensor- and expert-parallel process groups and the two collectives the layers need.

``ParallelContext`` is passed explicitly to every parallel layer (no module-global state).
With ``tp_size == 1`` nothing here touches ``torch.distributed``.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelContext:
    """Where this process sits in the tensor-parallel and expert-parallel groups and the pipeline's stages."""

    tp_rank: int = 0
    tp_size: int = 1
    tp_group: Any = None
    ep_rank: int = 0
    ep_size: int = 1
    ep_group: Any = None
    pp_rank: int = 0
    pp_size: int = 1

    def __post_init__(self):
        assert 0 <= self.tp_rank < self.tp_size, f"tp_rank {self.tp_rank} outside tp_size {self.tp_size}"
        assert 0 <= self.ep_rank < self.ep_size, f"ep_rank {self.ep_rank} outside ep_size {self.ep_size}"
        assert 0 <= self.pp_rank < self.pp_size, f"pp_rank {self.pp_rank} outside pp_size {self.pp_size}"


def tp_all_reduce(x: torch.Tensor, parallel: ParallelContext) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel group (in place when distributed)."""
    if parallel.tp_size == 1:
        return x
    dist.all_reduce(x, group=parallel.tp_group)
    return x


def tp_all_gather(x: torch.Tensor, parallel: ParallelContext, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    if parallel.tp_size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(parallel.tp_size)]
    dist.all_gather(parts, x, group=parallel.tp_group)
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int, what: str) -> int:
    """Exact division for sharding; a remainder is a user-visible configuration error."""
    if numerator % denominator:
        raise ValueError(
            f"{what} ({numerator}) is not divisible by the parallel size {denominator}; "
            f"choose a tensor_parallel_size that divides it"
        )
    return numerator // denominator


def init_distributed(
    rank: int,
    world_size: int,
    *,
    tp_size: int | None = None,
    ep_size: int = 1,
    pp_size: int = 1,
    device: torch.device | str = "cpu",
    init_method: str | None = None,
) -> ParallelContext:
    """Join the default process group (gloo on CPU, NCCL on CUDA) and carve TP / EP groups.

    Ranks ``[k*tp_size, (k+1)*tp_size)`` form tensor-parallel group ``k``; EP groups likewise. With ``pp_size``
    stages, stage ``s`` is ranks ``[s*w, (s+1)*w)``, ``w = world_size // pp_size`` (see ``distributed.pipeline``).
    ``init_method`` defaults to ``tcp://127.0.0.1:$MASTER_PORT`` (port 29500 when unset).
    """
    tp_size = world_size // pp_size if tp_size is None else tp_size
    for name, size in (("tensor_parallel_size", tp_size), ("expert_parallel_size", ep_size),
                       ("pipeline_parallel_size", pp_size)):
        if size < 1 or world_size % size:
            raise ValueError(f"{name} {size} must divide the number of processes {world_size}")
    if world_size == 1:
        return ParallelContext()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index if device.index is not None else rank % torch.cuda.device_count())
    if init_method is None:
        init_method = f"tcp://127.0.0.1:{os.environ.get('MASTER_PORT', '29500')}"
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    tp_group = _own_group(rank, world_size, tp_size)
    ep_group = _own_group(rank, world_size, ep_size)
    return ParallelContext(
        tp_rank=rank % tp_size, tp_size=tp_size, tp_group=tp_group,
        ep_rank=rank % ep_size, ep_size=ep_size, ep_group=ep_group,
        pp_rank=rank // (world_size // pp_size), pp_size=pp_size,
    )


def _own_group(rank: int, world_size: int, size: int):
    """Create every contiguous group of ``size`` ranks (all ranks must call this) and return ours."""
    if size == 1:
        return None
    if size == world_size:
        return dist.group.WORLD
    mine = None
    for start in range(0, world_size, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return mine


#: Set when leaving a process group timed out: the group may stay registered in this process for good.
teardown_stuck = False

#: Store counters: ranks that reached the teardown, ranks that left the group (rank 0 waits for both).
_ARRIVED_KEY = "nanocore/arrived_at_teardown"
_LEFT_KEY = "nanocore/left_group"


def destroy_distributed(timeout_s: float = 60.0, peers_exited=None) -> bool:
    """Leave the process group, all ranks together; rank 0, which hosts the store, returns last.

    The rendezvous runs on the TCP store, never a collective. Then NCCL: every rank destroys at once (its
    finalize pairs up across ranks: a worker destroying first while rank 0 waited for it hung at close on
    2 H200s). gloo: the other ranks tear down first, then rank 0 (a peer still using the store or its gloo
    pairs when rank 0 leaves is aborted). ``peers_exited`` (rank 0: how many worker processes ended) stops a
    wait early once a worker died before counting itself in. False when a step timed out or failed (the
    group may still be there)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()  # kept alive past destroy by this reference
    nccl = dist.get_backend() == "nccl"
    store.add(_ARRIVED_KEY, 1)
    if not _wait_for_count(store, _ARRIVED_KEY, world, timeout_s, peers_exited):
        return False
    left = True
    if nccl or rank != 0:
        left = _destroy_process_group_within(timeout_s)
    if rank != 0:
        store.add(_LEFT_KEY, 1)
        return left
    if not _wait_for_count(store, _LEFT_KEY, world - 1, timeout_s, peers_exited, exits_counted=True):
        return False
    return _destroy_process_group_within(timeout_s) if not nccl else left


def abandon_process_group(timeout_s: float = 10.0) -> bool:
    """Leave a group whose peers are gone or out of step (no rendezvous): NCCL communicators are aborted (a
    destroy would wait for the peers' finalize), gloo's group destroyed; bounded like every teardown."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.get_backend() == "nccl" and abort is not None:
        return _destroy_process_group_within(timeout_s, abort)
    return _destroy_process_group_within(timeout_s)


def _destroy_process_group_within(timeout_s: float, destroy=None) -> bool:
    """``dist.destroy_process_group()`` (or ``destroy``), given up with a warning after ``timeout_s``: a peer
    that never joins NCCL's finalize must not hang the caller for ever. A timed-out call keeps running in
    its thread (NCCL offers no way to cancel it), so the group may still exist: a new tensor-parallel engine
    in this process then refuses to start with a clear error."""
    destroy = destroy or dist.destroy_process_group
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            destroy()
        except BaseException as exc:  # reported by the caller, not the thread's excepthook
            failure.append(exc)
        finally:
            done.set()

    global teardown_stuck
    threading.Thread(target=run, name="nanocore-leave-process-group", daemon=True).start()
    if not done.wait(timeout_s):
        teardown_stuck = True
        logger.warning("leaving the torch.distributed process group did not finish within %.0f s; going on "
                       "without it (a new tensor-parallel engine in this process may refuse to start)", timeout_s)
        return False
    if failure:
        logger.warning("leaving the torch.distributed process group failed: %s", failure[0])
        return False
    return True


def _wait_for_count(store, key: str, count: int, timeout_s: float, peers_exited=None,
                    exits_counted: bool = False) -> bool:
    """Poll a store counter until it reaches ``count``; False after ``timeout_s``, or once more workers ended
    than the counter explains (``exits_counted``: a worker counts itself in before it exits, so exits up to
    the count are normal)."""
    deadline = time.monotonic() + timeout_s
    while True:
        gone = peers_exited() if peers_exited is not None else 0  # before the counter: a normal exit shows in it
        reached = store.add(key, 0)
        if reached >= count:
            return True
        if gone > (reached if exits_counted else 0):
            logger.warning("teardown: a worker ended before %s reached %d", key, count)
            return False
        if time.monotonic() > deadline:
            logger.warning("teardown: %s stayed below %d for %.0f s", key, count, timeout_s)
            return False
        time.sleep(0.005)


def exit_worker_process(code: int = 0) -> None:
    """End a spawned worker without interpreter teardown (static destructors of gloo / store threads can
    abort a process that already finished its work)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
