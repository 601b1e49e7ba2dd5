"""Shared by the spawned gloo test workers (tp_worker, tp_min_worker, moe_ep_worker, teardown_worker)."""
from __future__ import annotations

import socket
import time

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_two_ranks(worker, *args) -> None:
    """Run ``worker(rank, port, *args)`` in two spawned processes that rendezvous on a free local port."""
    mp.spawn(worker, args=(free_port(), *args), nprocs=2, join=True)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie nobody reaped has ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except OSError:
        return False


def wait_until_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_alive(pid)
