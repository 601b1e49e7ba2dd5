"""For tests/test_teardown.py: a spawned rank whose parent dies without a word must end by itself.

Usage: python tests/orphan_worker.py PID_FILE  (the parent exits once the child wrote its pid)
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path


def child(pid_file: str, parent_pid: int) -> None:
    from nanocore.runner.worker_process import exit_when_orphaned

    exit_when_orphaned(parent_pid, poll_s=0.05)
    tmp = Path(pid_file + ".tmp")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pid_file)  # the parent sees the whole pid or nothing
    time.sleep(60)  # as if stuck in a collective


if __name__ == "__main__":
    proc = mp.get_context("spawn").Process(target=child, args=(sys.argv[1], os.getpid()))
    proc.start()
    while not Path(sys.argv[1]).exists():
        time.sleep(0.05)
    os._exit(0)  # like a SIGKILLed engine: no atexit, no terminate() of the child
