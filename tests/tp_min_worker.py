"""KV block agreement for tests/test_engine_parallel.py: two gloo ranks offer 7 and 12 blocks, both get 7.

Usage: python tests/tp_min_worker.py OUT_DIR  (writes OUT_DIR/rank{0,1}.txt)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from spawn_helpers import spawn_two_ranks  # the script's folder is on sys.path

OFFERED = (12, 7)  # rank 0 has more room than rank 1: the minimum must win


def worker(rank: int, port: int, out_dir: str) -> None:
    from nanocore.config import EngineConfig
    from nanocore.distributed import destroy_distributed, exit_worker_process
    from nanocore.runner.worker_process import join_process_group, min_over_ranks

    config = EngineConfig(model="dummy:x", device="cpu", tensor_parallel_size=2)
    join_process_group(rank, 2, config, torch.device("cpu"), f"tcp://127.0.0.1:{port}")
    agreed = min_over_ranks(OFFERED[rank], torch.device("cpu"))
    destroy_distributed()
    (Path(out_dir) / f"rank{rank}.txt").write_text(str(agreed))
    exit_worker_process(0)  # results are saved; skip interpreter teardown (gloo threads can abort it)



if __name__ == "__main__":
    spawn_two_ranks(worker, sys.argv[1])
