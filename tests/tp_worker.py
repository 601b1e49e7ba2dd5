"""TP=2 run for tests/test_tensor_parallel.py: two gloo processes load each checkpoint and save logits.

Usage: python tests/tp_worker.py OUT_DIR CKPT_DIR [CKPT_DIR ...]  (writes OUT_DIR/<ckpt name>.rank{0,1}.pt)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from spawn_helpers import spawn_two_ranks  # the script's folder is on sys.path

sys.path.insert(0, str(Path(__file__).parent))
from model_fixtures import nanocore_logits  # noqa: E402

SEQS = [[5, 17, 200, 3, 99, 42, 7, 150, 249], [8, 1, 77]]


def worker(rank: int, port: int, out_dir: str, checkpoints: list[str]) -> None:
    from nanocore.config import EngineConfig
    from nanocore.distributed import destroy_distributed, exit_worker_process, init_distributed
    from nanocore.loader import load_model

    torch.set_num_threads(1)
    parallel = init_distributed(rank, 2, init_method=f"tcp://127.0.0.1:{port}")
    for ckpt in checkpoints:
        loaded = load_model(EngineConfig(model=ckpt, device="cpu", tensor_parallel_size=2), "cpu", parallel)
        logits = nanocore_logits(loaded.model, SEQS)
        torch.save({"logits": logits, "kv_cache_spec": loaded.model.kv_cache_spec},
                   Path(out_dir) / f"{Path(ckpt).name}.rank{rank}.pt")
    destroy_distributed()
    exit_worker_process(0)  # results are saved; skip interpreter teardown (gloo threads can abort it)



if __name__ == "__main__":
    spawn_two_ranks(worker, sys.argv[1], sys.argv[2:])
