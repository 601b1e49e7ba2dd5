"""Shared by the spawned gloo test workers (tp_worker, tp_min_worker, moe_ep_worker, moe_ep_fp8_worker,
teardown_worker)."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_two_ranks(worker, *args) -> None:
    """Run ``worker(rank, port, *args)`` in two spawned processes that rendezvous on a free local port."""
    mp.spawn(worker, args=(free_port(), *args), nprocs=2, join=True)


def run_two_rank_script(script: Path, out_dir: Path, timeout_s: float = 240) -> None:
    """Run a two-rank worker script (``python SCRIPT OUT_DIR``) and check that both ranks wrote ``rank{N}.ok``."""
    import subprocess
    import sys
    result = subprocess.run([sys.executable, str(script), str(out_dir)], capture_output=True, text=True,
                            timeout=timeout_s)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert (out_dir / f"rank{rank}.ok").read_text() == "ok"


def finish_ep_check(rank: int, ep, single, out_dir: str, tokens_per_rank: tuple[int, ...], num_experts: int,
                    hidden: int) -> None:
    """The MoE EP workers' last half: this rank's tokens through the EP layer and the EP=1 one (some tokens routed
    only to the other rank's experts), equal outputs, then ``rank{N}.ok`` and an exit without interpreter teardown."""
    import torch

    from nanocore.distributed import destroy_distributed, exit_worker_process
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens_per_rank[rank], hidden, generator=g)
    logits = torch.randn(tokens_per_rank[rank], num_experts, generator=g)
    logits[:3, num_experts // 2:] += 10.0  # these tokens only need the other rank's experts
    torch.testing.assert_close(ep(x, logits), single(x, logits), atol=1e-5, rtol=1e-5)
    destroy_distributed()
    (Path(out_dir) / f"rank{rank}.ok").write_text("ok")
    exit_worker_process(0)  # results are saved; skip interpreter teardown (gloo threads can abort it)


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
