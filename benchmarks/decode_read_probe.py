"""How fast can a decode step read a paged KV cache at all? (issue 17; GPU only, a diagnostic, not installed)

``python3 -m benchmarks.decode_read_probe OUTDIR``: a kernel that only reads K and V the way decode attention
does (per sequence through the block table, ``BLOCK_N`` cached tokens per step) and sums the values, for the
[slot, head, dim] cache at the shape of ``decode_probe_shape`` (64 sequences x 4,096 tokens, 8 KV heads, scattered
pages of 16). Varied: page order (``--head-major``: a head's page stored as one run), element size (one byte /
bf16), KV heads per program (1: a head's row of a token is 128 bytes in a one-byte cache, 256 in bf16; 2+:
neighbouring heads' rows read as one contiguous run), tile, warps and splits.
The one-byte attention kernels all stop near 2.7 TB/s at this shape while bf16's reads 4.2. The default (float)
probe converts every int8 element with one ``I2F`` (16 per SM per clock on Hopper: at least ~130 us of the 64 x 4096
step), so it stops near 2.8 too; ``--words`` reads the same bytes as int32 words and sums them as integers, which
measures reading alone (3.1-4.0 TB/s over its configs on the H200, session 13); ``--stages`` pipelines its loop.
Every row is checked per (sequence, head group) against a torch gather through the block tables. Writes
``OUTDIR/decode_read_probe*.json`` and prints TB/s per variant.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

from benchmarks import decode_probe_shape as shape
from benchmarks.decode_probe_shape import tile_rows


@triton.jit
def _read_kernel(k_ptr, v_ptr, block_tables_ptr, out_ptr, seq_len, stride_bt, stride_blk, stride_tok, stride_grp,
                 num_splits, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 WORDS: tl.constexpr, STAGES: tl.constexpr):
    """Per (sequence, group of heads, split): the sum over its tokens of K + V, ``WIDTH`` columns. ``WORDS``: the
    cache as int32 words (strides in words) summed as integers, else every element converted to fp32."""
    seq = tl.program_id(0)
    group = tl.program_id(1)  # WIDTH / row width neighbouring heads
    split = tl.program_id(2)
    cols = tl.arange(0, WIDTH)
    per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    acc = tl.zeros([WIDTH], tl.int32 if WORDS else tl.float32)
    for tile in tl.range(split * per_split, (split + 1) * per_split, num_stages=STAGES):
        rows, ok = tile_rows(block_tables_ptr, seq, stride_bt, tile, seq_len, stride_blk, stride_tok, BLOCK_N,
                             PAGE_SIZE)
        offs = rows[:, None] + group * stride_grp + cols[None, :]
        k = tl.load(k_ptr + offs, mask=ok[:, None], other=0)
        v = tl.load(v_ptr + offs, mask=ok[:, None], other=0)
        if WORDS:
            acc += tl.sum(k + v, 0)
        else:
            acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), 0)
    tl.store(out_ptr + (seq * tl.num_programs(1) + group) * tl.num_programs(2) * WIDTH + split * WIDTH + cols, acc)


def case(dtype, head_major=False, device="cuda"):
    """K / V ``[pages, PAGE, heads, dim]`` (token-major pages, the engine's) or, ``head_major``, the same logical
    shape over ``[pages, heads, PAGE, dim]`` storage (a head's page is one contiguous run)."""
    torch.manual_seed(0)
    pages = shape.SEQS * shape.CTX // shape.PAGE
    dims = (pages, shape.KV_HEADS, shape.PAGE, shape.HEAD_DIM) if head_major else (
        pages, shape.PAGE, shape.KV_HEADS, shape.HEAD_DIM)
    k, v = (torch.randint(-100, 100, dims, dtype=torch.int8, device=device).to(dtype) for _ in range(2))
    if head_major:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v, shape.scattered_tables(device)


def run(k, v, tables, heads, block_n, warps, splits, words=False, stages=1):
    """The probe's sums ``[SEQS, groups, splits * WIDTH]`` (int32 words or fp32 values)."""
    if words:
        k, v = k.view(torch.int32), v.view(torch.int32)
    width = heads * k.shape[-1]
    groups = shape.KV_HEADS // heads
    out = torch.empty(shape.SEQS, groups, splits * width, dtype=torch.int32 if words else torch.float32,
                      device=k.device)
    _read_kernel[(shape.SEQS, groups, splits)](
        k, v, tables, out, shape.CTX, tables.stride(0), k.stride(0), k.stride(1), k.stride(2) * heads, splits,
        WIDTH=width, BLOCK_N=block_n, PAGE_SIZE=shape.PAGE, WORDS=words, STAGES=stages, num_warps=warps)
    return out


def reference(k, v, tables, heads, words=False) -> torch.Tensor:
    """``[SEQS, groups]``: each (sequence, group of heads)'s sum of K + V through its block table (words: int64
    modulo 2**32; values: float64)."""
    if words:
        k, v = k.view(torch.int32), v.view(torch.int32)
    dtype = torch.int64 if words else torch.float64
    total = sum(shape.gathered(x, tables).to(dtype).sum((1, 3)) for x in (k, v))  # [SEQS, heads]
    total = total.view(shape.SEQS, -1, heads).sum(-1)
    return total % 2**32 if words else total


def check(out, want, words) -> float:
    """Words: 0.0 where every (sequence, group) sum is exact modulo 2**32, else 1.0; values: the relative error."""
    if words:
        return float(not torch.equal(out.long().sum(-1) % 2**32, want))
    got = out.double().sum(-1)
    return ((got - want).norm() / want.norm()).item()


def probe(args) -> list[dict]:
    rows = []
    tiles = ((16, 1), (32, 1), (64, 4), (128, 4), (128, 8), (256, 8)) if args.words else (
        (16, 1), (32, 1), (64, 1), (32, 4), (64, 4), (128, 4))
    heads_options = (1,) if args.head_major else ((1, 2) if args.words else (1, 2, 4, 8))
    for dtype in (torch.int8, torch.bfloat16):
        k, v, tables = case(dtype, args.head_major)
        nbytes = 2 * k.numel() * k.element_size()
        for heads in heads_options:
            want = reference(k, v, tables, heads, args.words)
            for (block_n, warps), splits, stages in itertools.product(tiles, args.splits, args.stages):
                if heads * block_n * k.element_size() > 64 * warps:  # K + V over 512 bytes per thread: register-bound
                    continue
                fn = lambda: run(k, v, tables, heads, block_n, warps, splits, args.words, stages)  # noqa: E731
                result = shape.measure(fn, lambda out: check(out, want, args.words))
                if result is None:
                    continue
                err, ms = result
                row = dict(dtype=str(dtype).split(".")[-1], words=args.words, head_major=args.head_major,
                           heads_per_program=heads, block_n=block_n, warps=warps, splits=splits, stages=stages,
                           us=ms * 1e3, tb_per_s=nbytes / ms / 1e9, error=err)
                rows.append(row)
                print(f"{'words ' if args.words else ''}{'head-major ' if args.head_major else ''}{row['dtype']:<9} "
                      f"heads {heads} tile {block_n:>3}/{warps} splits {splits} stages {stages}: {row['us']:7.1f} us "
                      f"{row['tb_per_s']:.2f} TB/s ({'mismatches' if args.words else 'rel err'} {err:.1e})", flush=True)
        del k, v, tables
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--splits", type=int, nargs="+", default=[1, 4], help="KV splits per (sequence, head group)")
    p.add_argument("--head-major", action="store_true", help="pages stored [page, head, token, dim]: one head only")
    p.add_argument("--words", action="store_true", help="read int32 words, integer sums (reading alone)")
    p.add_argument("--stages", type=int, nargs="+", help="software pipeline stages of the loop (default: 1 3 for "
                   "--words; 3, Triton's default, for the float probe, as session 12 ran it)")
    args = p.parse_args(argv)
    args.stages = args.stages or ([1, 3] if args.words else [3])
    out = dict(shape.header(), rows=probe(args))
    tag = ("" if args.splits == [1, 4] else "_splits" + "_".join(map(str, args.splits))) + (
        "_head_major" if args.head_major else "") + ("_words" if args.words else "")
    with open(os.path.join(args.outdir, f"decode_read_probe{tag}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
