"""Leaving the tensor-parallel process group: the NCCL branch (all ranks destroy at once) and the guard that
keeps a destroy that never returns from hanging the engine's close()."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from spawn_helpers import wait_until_gone  # noqa: E402

from nanocore.distributed import parallel  # noqa: E402


def test_all_ranks_destroy_together_and_rank0_waits_for_a_late_peer(tmp_path):
    script = Path(__file__).parent / "teardown_worker.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = [(tmp_path / f"rank{r}.txt").read_text().split() for r in range(2)]
    assert [initialized for initialized, _ in outcome] == ["False", "False"]
    rank0_s, rank1_s = (float(seconds) for _, seconds in outcome)
    assert 0.5 < rank0_s < 15, rank0_s  # waited for rank 1 on the store, then left well before the timeout
    assert rank1_s < 15, rank1_s


def test_a_destroy_that_never_returns_is_given_up_with_a_warning(monkeypatch, caplog):
    never = threading.Event()
    monkeypatch.setattr(parallel, "teardown_stuck", False)  # restored after: the timeout below sets it
    monkeypatch.setattr(parallel.dist, "destroy_process_group", lambda: never.wait())  # looked up per call
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=parallel.__name__):
        parallel._destroy_process_group_within(0.3)
    assert 0.25 < time.monotonic() - start < 5
    assert "did not finish within" in caplog.text and parallel.teardown_stuck
    never.set()


def test_a_worker_whose_engine_process_died_ends_itself(tmp_path):
    pid_file = tmp_path / "child.pid"
    subprocess.run([sys.executable, str(Path(__file__).parent / "orphan_worker.py"), str(pid_file)], timeout=60,
                   check=True)
    assert wait_until_gone(int(pid_file.read_text()), timeout_s=10), "the orphaned worker is still running"


def test_a_broken_nccl_group_is_aborted_not_destroyed(monkeypatch):
    calls = []
    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(parallel.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(parallel.dist.distributed_c10d, "_abort_process_group", lambda: calls.append("abort"))
    monkeypatch.setattr(parallel.dist, "destroy_process_group", lambda: calls.append("destroy"))
    parallel.abandon_process_group(timeout_s=5)
    monkeypatch.setattr(parallel.dist, "get_backend", lambda group=None: "gloo")
    parallel.abandon_process_group(timeout_s=5)
    assert calls == ["abort", "destroy"]


def test_a_new_engine_after_a_stuck_teardown_says_to_start_a_new_process(monkeypatch):
    import torch

    from nanocore.config import EngineConfig
    from nanocore.runner.worker_process import join_process_group

    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(parallel, "teardown_stuck", True)
    config = EngineConfig(model="dummy:x", device="cpu", tensor_parallel_size=2)
    with pytest.raises(RuntimeError, match="could not leave its process group.*new Python process"):
        join_process_group(0, 2, config, torch.device("cpu"), "tcp://127.0.0.1:1")
