"""Liveness of launcher ranks: each rank bumps a counter on the rendezvous store, and watches everyone else's.

A peer whose counter stands still for ``timeout_s`` (killed, its host gone, its process frozen), or that posted
an error, is reported once through ``on_failure(message)``, from the monitor thread: a collective waiting on a dead
peer on another host may otherwise wait for the process group's whole timeout. Counters, not timestamps: the
hosts' clocks need not agree.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

_BEAT = "nanocore/heartbeat/{}"
_WHERE = "nanocore/where/{}"
_ERROR = "nanocore/error/{}"
_ERRORS = "nanocore/errors"
#: beats per timeout: a peer is declared silent after missing this many in a row
BEATS_PER_TIMEOUT = 5


class Heartbeat:
    def __init__(self, store, rank: int, world_size: int, timeout_s: float, on_failure: Callable[[str], None]):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s, self.on_failure = timeout_s, on_failure
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nanocore-heartbeat", daemon=True)
        store.set(_WHERE.format(rank), f"host {socket.gethostname()}, pid {os.getpid()}")

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more beats or checks (before a clean shutdown, where ranks leave at different moments)."""
        self._stop.set()

    def peer_error(self) -> str | None:
        """The first error a rank posted (``post_error``), with where it ran; None when none did."""
        try:
            if self.store.add(_ERRORS, 0) == 0:
                return None
            for rank in range(self.world_size):
                if rank != self.rank and self.store.check([_ERROR.format(rank)]):
                    return f"rank {rank} ({self.where(rank)}) failed: {self.store.get(_ERROR.format(rank)).decode()}"
        except Exception:  # the store is gone too: the caller reports what it has
            return None
        return None

    def where(self, rank: int) -> str:
        try:
            return self.store.get(_WHERE.format(rank)).decode()
        except Exception:
            return "where unknown"

    def _run(self) -> None:
        period = self.timeout_s / BEATS_PER_TIMEOUT
        peers = [r for r in range(self.world_size) if r != self.rank]
        seen = {r: (-1, time.monotonic()) for r in peers}  # (counter, when it last moved)
        store_lost_at = None
        while not self._stop.wait(period):
            now = time.monotonic()
            try:
                self.store.add(_BEAT.format(self.rank), 1)
                problem = self.peer_error()
                for rank in peers:
                    count = self.store.add(_BEAT.format(rank), 0)
                    if count != seen[rank][0]:
                        seen[rank] = (count, now)
                    elif now - seen[rank][1] > self.timeout_s and problem is None:
                        problem = (f"rank {rank} ({self.where(rank)}) sent no heartbeat for {self.timeout_s:.0f} s: "
                                   f"it was killed, crashed or hangs; see that rank's log")
                store_lost_at = None
            except Exception as exc:  # the store lives with rank 0's launcher: its node may be gone
                store_lost_at = store_lost_at or now
                problem = None if now - store_lost_at < self.timeout_s else (
                    f"lost the rendezvous store (MASTER_ADDR:MASTER_PORT) for {self.timeout_s:.0f} s ({exc}): "
                    f"rank 0's node or its launcher is gone")
            if problem and not self._stop.is_set():
                self._stop.set()
                self.on_failure(problem)
                return


def post_error(store, rank: int, summary: str) -> None:
    """Tell the other ranks why this one is failing (their heartbeat reports it at once)."""
    try:
        store.set(_ERROR.format(rank), summary[:4000])
        store.add(_ERRORS, 1)
    except Exception:  # the store is gone: the silence reports us instead
        pass
