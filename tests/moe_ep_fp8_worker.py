"""EP=2 with fp8 experts, run by tests/test_moe_fp8_experts.py: two gloo processes, each compares an fp8 EP=2 layer
(``triton_fused_moe``'s torch twin) with an EP=1 float layer (``eager``) on the dequantized weights.

Usage: python tests/moe_ep_fp8_worker.py OUT_DIR  (writes OUT_DIR/rank{0,1}.ok, or raises).
"""
from __future__ import annotations

import sys

import torch

from spawn_helpers import finish_ep_check, spawn_two_ranks  # the script's folder is on sys.path

TOKENS_PER_RANK = (13, 1)  # rank 0: a prefill, some tokens routed only to rank 1's experts; rank 1: a decode
E, TOP_K, H, I = 8, 3, 16, 12


def worker(rank: int, port: int, out_dir: str) -> None:
    from nanocore.builtin.eager_moe import EagerMoEExecutor
    from nanocore.distributed import init_distributed
    from nanocore.layers.moe import FusedMoE
    from nanocore.toolkit.numerics import quantize_fp8_per_row
    from nanocore_triton_fused_moe import TritonFusedMoEExecutor

    parallel = init_distributed(rank, 2, tp_size=1, ep_size=2, init_method=f"tcp://127.0.0.1:{port}")
    g = torch.Generator().manual_seed(0)
    ep = FusedMoE(E, TOP_K, H, I, executor=TritonFusedMoEExecutor({"impl": "torch"}), parallel=parallel,
                  renormalize=True, weight_format="fp8_channel")
    single = FusedMoE(E, TOP_K, H, I, executor=EagerMoEExecutor(), renormalize=True)
    for e in range(E):
        for shard, shape in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
            q, scale = quantize_fp8_per_row(torch.randn(*shape, generator=g))
            name = "w2" if shard == "w2" else "w13"
            for param, tensor in ((getattr(ep, name), q), (getattr(ep, f"{name}_scale"), scale)):
                param.weight_loader(param, tensor, e, shard)
            getattr(single, name).weight_loader(getattr(single, name), q.float() * scale, e, shard)
    finish_ep_check(rank, ep, single, out_dir, TOKENS_PER_RANK, E, H)


if __name__ == "__main__":
    spawn_two_ranks(worker, sys.argv[1])
