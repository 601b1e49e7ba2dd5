"""The decode shape the issue-17 probes share (``decode_read_probe``, ``decode_ladder_probe``): 64 sequences x 4,096
cached tokens, 8 KV heads, head_dim 128, pages of 16 scattered by a random permutation (Qwen3-0.6B's layer at the
64 x 4K decode target), the block-table walk of the engine's kernels, and the probes' timing loop and JSON header.
Tests shrink the shape by patching this module's constants."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

SEQS, CTX, KV_HEADS, HEAD_DIM, PAGE = 64, 4096, 8, 128, 16


def scattered_tables(device) -> torch.Tensor:
    """``[SEQS, CTX // PAGE]`` block tables over every page once, in random order."""
    return torch.randperm(SEQS * CTX // PAGE, device=device, dtype=torch.int32).view(SEQS, CTX // PAGE)


def gathered(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """``x`` ``[pages, PAGE, heads, ...]`` gathered per sequence through ``tables``: ``[SEQS, CTX, heads, ...]``."""
    return x[tables.long()].flatten(1, 2)


@triton.jit
def tile_rows(block_tables_ptr, seq, stride_bt, tile, seq_len, stride_blk, stride_tok,
              BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Cache-row offsets (int64, in elements) of tile ``tile``'s ``BLOCK_N`` tokens of sequence ``seq``, found through
    its block table (any page order, by strides), and which of them exist."""
    pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = pos < seq_len
    blk = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE_SIZE, mask=ok, other=0)
    return blk.to(tl.int64) * stride_blk + (pos % PAGE_SIZE) * stride_tok, ok


def measure(fn, check):
    """``check(fn())`` (the config's correctness figure), then ``fn``'s median ms by ``do_bench``; None (with a line
    saying why) where the config does not fit the GPU."""
    from triton.testing import do_bench
    try:
        verdict = check(fn())
    except triton.runtime.errors.OutOfResources as e:  # shared memory of deep pipelines on wide tiles
        print(f"skip: {e}")
        return None
    return verdict, do_bench(fn, warmup=10, rep=40, return_mode="median")


def header(**shape) -> dict:
    """The JSON header every probe writes: device, versions, commit, shape."""
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("NANOCORE_GIT_COMMIT", ""), "shape": dict(
                seqs=SEQS, ctx=CTX, kv_heads=KV_HEADS, head_dim=HEAD_DIM, page=PAGE, **shape)}
