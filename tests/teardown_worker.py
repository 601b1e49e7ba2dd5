"""Teardown for tests/test_teardown.py: two gloo ranks leave the group through the NCCL branch of
``destroy_distributed`` with NCCL's pairing emulated (a rank's destroy returns only once every rank has
entered its own), then each records how long it took. An order where one rank waits for the other to
finish destroying first deadlocks here until the timeout, as it did on 2 H200s.

Usage: python tests/teardown_worker.py OUT_DIR  (writes OUT_DIR/rank{0,1}.txt)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from spawn_helpers import spawn_two_ranks  # the script's folder is on sys.path


def worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from nanocore.config import EngineConfig
    from nanocore.distributed import destroy_distributed, exit_worker_process
    from nanocore.runner.worker_process import join_process_group, min_over_ranks

    config = EngineConfig(model="dummy:x", device="cpu", tensor_parallel_size=2)
    join_process_group(rank, 2, config, torch.device("cpu"), f"tcp://127.0.0.1:{port}")
    min_over_ranks(rank, torch.device("cpu"))  # one collective, as the engine's steps leave it
    dist.get_backend = lambda group=None: "nccl"  # take the all-ranks-at-once path on gloo
    store, real_destroy = dist.distributed_c10d._get_default_store(), dist.destroy_process_group

    def paired_destroy(group=None):  # NCCL's finalize: nobody finishes until every rank is in it
        store.add("test/in_destroy", 1)
        while store.add("test/in_destroy", 0) < 2:
            time.sleep(0.01)
        real_destroy()

    dist.destroy_process_group = paired_destroy
    if rank == 1:
        time.sleep(1.0)  # arrive late: rank 0 must wait on the store, not in a collective
    start = time.monotonic()
    destroy_distributed(timeout_s=20)
    (Path(out_dir) / f"rank{rank}.txt").write_text(f"{dist.is_initialized()} {time.monotonic() - start:.2f}")
    exit_worker_process(0)


if __name__ == "__main__":
    spawn_two_ranks(worker, sys.argv[1])
