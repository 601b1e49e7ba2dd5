"""EP=2 check run by tests/test_moe_layer.py: two gloo processes, each compares EP=2 with EP=1.

Usage: python tests/moe_ep_worker.py OUT_DIR  (writes OUT_DIR/rank{0,1}.ok, or raises).
"""
from __future__ import annotations

import sys

import torch

from spawn_helpers import finish_ep_check, spawn_two_ranks  # the script's folder is on sys.path

# rank 0: many tokens incl. some routed only to rank 1's experts; rank 1: a single token (decode)
TOKENS_PER_RANK = (13, 1)
E, TOP_K, H, I = 8, 3, 16, 12


def worker(rank: int, port: int, out_dir: str) -> None:
    from nanocore.builtin.eager_moe import EagerMoEExecutor
    from nanocore.distributed import ParallelContext, init_distributed
    from nanocore.layers.moe import FusedMoE

    parallel = init_distributed(rank, 2, tp_size=1, ep_size=2, init_method=f"tcp://127.0.0.1:{port}")
    g = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    ep, single = (FusedMoE(E, TOP_K, H, I, executor=EagerMoEExecutor(), parallel=p, renormalize=True)
                  for p in (parallel, ParallelContext()))
    for layer in (ep, single):
        for e in range(E):
            layer.w13.weight_loader(layer.w13, w13[e, :I], e, "w1")
            layer.w13.weight_loader(layer.w13, w13[e, I:], e, "w3")
            layer.w2.weight_loader(layer.w2, w2[e], e, "w2")
    finish_ep_check(rank, ep, single, out_dir, TOKENS_PER_RANK, E, H)


if __name__ == "__main__":
    spawn_two_ranks(worker, sys.argv[1])
