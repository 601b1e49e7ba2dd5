"""EP=2 check run by tests/test_moe_layer.py: two gloo processes, each compares EP=2 with EP=1.

Usage: python tests/moe_ep_worker.py OUT_DIR  (writes OUT_DIR/rank{0,1}.ok, or raises).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from spawn_helpers import spawn_two_ranks  # the script's folder is on sys.path

# rank 0: many tokens incl. some routed only to rank 1's experts; rank 1: a single token (decode)
TOKENS_PER_RANK = (13, 1)
E, TOP_K, H, I = 8, 3, 16, 12


def worker(rank: int, port: int, out_dir: str) -> None:
    from nanocore.builtin.eager_moe import EagerMoEExecutor
    from nanocore.distributed import ParallelContext, destroy_distributed, exit_worker_process, init_distributed
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
    g.manual_seed(100 + rank)
    x, logits = torch.randn(TOKENS_PER_RANK[rank], H, generator=g), torch.randn(TOKENS_PER_RANK[rank], E, generator=g)
    logits[:3, E // 2:] += 10.0  # these tokens only need the other half of the experts
    torch.testing.assert_close(ep(x, logits), single(x, logits), atol=1e-5, rtol=1e-5)
    destroy_distributed()
    (Path(out_dir) / f"rank{rank}.ok").write_text("ok")
    exit_worker_process(0)  # results are saved; skip interpreter teardown (gloo threads can abort it)



if __name__ == "__main__":
    spawn_two_ranks(worker, sys.argv[1])
