"""How fast can a decode step read a paged KV cache at all? (issue 17; GPU only, a diagnostic, not installed)

``python3 -m benchmarks.decode_read_probe OUTDIR``: a kernel that only reads K and V the way decode attention
does (per sequence through the block table, ``BLOCK_N`` cached tokens per step) and sums the values, for the
[slot, head, dim] cache at 64 sequences x 4,096 tokens, 8 KV heads, head_dim 128, pages of 16, scattered pages.
Varied: page order (``--head-major``: a head's page stored as one run), element size (one byte / bf16), KV heads per program (1: a head's row of a token is 128 bytes in a
one-byte cache, 256 in bf16; 2+: neighbouring heads' rows read as one contiguous run), tile, warps and splits.
The one-byte attention kernels all stop near 2.7 TB/s at this shape while bf16's reads 4.2. The default (float)
probe converts every int8 element with one ``I2F`` (16 per SM per clock on Hopper: about 128 us of the 64 x 4096
step), so it stops near 2.8 too; ``--words`` reads the same bytes as int32 words and sums them as integers, which
measures reading alone (3.7-4.0 TB/s on the H200, session 13);
``--stages`` pipelines its loop (loads in flight across tiles). Writes ``OUTDIR/decode_read_probe*.json`` and
prints TB/s per variant.
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

SEQS, CTX, KV_HEADS, HEAD_DIM, PAGE = 64, 4096, 8, 128, 16


@triton.jit
def _read_kernel(k_ptr, v_ptr, block_tables_ptr, out_ptr, seq_len, stride_bt, stride_blk, stride_tok, stride_grp,
                 num_splits, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    seq = tl.program_id(0)
    group = tl.program_id(1)  # WIDTH / head_dim neighbouring heads
    split = tl.program_id(2)
    cols = tl.arange(0, WIDTH)
    per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    acc = tl.zeros([WIDTH], tl.float32)
    for tile in range(split * per_split, (split + 1) * per_split):
        pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = pos < seq_len
        blk = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE_SIZE, mask=ok, other=0)
        row = blk.to(tl.int64) * stride_blk + (pos % PAGE_SIZE) * stride_tok  # any page order, by strides
        offs = row[:, None] + group * stride_grp + cols[None, :]
        k = tl.load(k_ptr + offs, mask=ok[:, None], other=0)
        v = tl.load(v_ptr + offs, mask=ok[:, None], other=0)
        acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), 0)
    tl.store(out_ptr + (seq * tl.num_programs(1) + group) * tl.num_programs(2) * WIDTH + split * WIDTH + cols, acc)


@triton.jit
def _read_words_kernel(k_ptr, v_ptr, block_tables_ptr, out_ptr, seq_len, stride_bt, stride_blk, stride_tok, stride_grp,
                       num_splits, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                       STAGES: tl.constexpr):
    """``_read_kernel`` over int32 words (strides in words), integer sums: no per-element conversion."""
    seq = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    cols = tl.arange(0, WIDTH)
    per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    acc = tl.zeros([WIDTH], tl.int32)
    for tile in tl.range(split * per_split, (split + 1) * per_split, num_stages=STAGES):
        pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = pos < seq_len
        blk = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE_SIZE, mask=ok, other=0)
        offs = (blk.to(tl.int64) * stride_blk + (pos % PAGE_SIZE) * stride_tok)[:, None] + group * stride_grp + cols[None, :]
        acc += tl.sum(tl.load(k_ptr + offs, mask=ok[:, None], other=0) + tl.load(v_ptr + offs, mask=ok[:, None], other=0), 0)
    tl.store(out_ptr + (seq * tl.num_programs(1) + group) * tl.num_programs(2) * WIDTH + split * WIDTH + cols, acc)


def case(dtype, head_major=False):
    """K / V ``[pages, PAGE, heads, dim]`` (token-major pages, the engine's) or, ``head_major``, the same logical
    shape over ``[pages, heads, PAGE, dim]`` storage (a head's page is one contiguous run)."""
    torch.manual_seed(0)
    pages = SEQS * CTX // PAGE
    shape = (pages, KV_HEADS, PAGE, HEAD_DIM) if head_major else (pages, PAGE, KV_HEADS, HEAD_DIM)
    k = torch.randint(-100, 100, shape, dtype=torch.int8, device="cuda")
    v = torch.randint(-100, 100, shape, dtype=torch.int8, device="cuda")
    if dtype == torch.bfloat16:
        k, v = k.bfloat16(), v.bfloat16()
    if head_major:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    tables = torch.randperm(pages, device="cuda", dtype=torch.int32).view(SEQS, CTX // PAGE)
    return k, v, tables


def run(k, v, tables, heads, block_n, warps, splits):
    groups = KV_HEADS // heads
    out = torch.empty(SEQS * groups * splits * heads * HEAD_DIM, dtype=torch.float32, device="cuda")
    _read_kernel[(SEQS, groups, splits)](k, v, tables, out, CTX, tables.stride(0), k.stride(0), k.stride(1),
                                         k.stride(2) * heads, splits, WIDTH=heads * HEAD_DIM, BLOCK_N=block_n,
                                         PAGE_SIZE=PAGE, num_warps=warps)
    return out


def run_words(k, v, tables, heads, block_n, warps, splits, stages):
    """The word probe: ``k`` / ``v`` viewed as int32 (a one-byte row of 128 elements is 32 words, a bf16 row 64)."""
    kw, vw = k.view(torch.int32), v.view(torch.int32)
    width = heads * kw.shape[-1]
    out = torch.empty(SEQS * (KV_HEADS // heads) * splits * width, dtype=torch.int32, device=k.device)
    _read_words_kernel[(SEQS, KV_HEADS // heads, splits)](
        kw, vw, tables, out, CTX, tables.stride(0), kw.stride(0), kw.stride(1), kw.stride(2) * heads, splits,
        WIDTH=width, BLOCK_N=block_n, PAGE_SIZE=PAGE, STAGES=stages, num_warps=warps)
    return out


def words_main(args) -> list[dict]:
    """Every (dtype, heads, tile, warps, splits, stages) of the word probe; checked exactly (sums modulo 2**32)."""
    from triton.testing import do_bench
    rows = []
    for dtype in (torch.int8, torch.bfloat16):
        k, v, tables = case(dtype, args.head_major)
        nbytes = 2 * k.numel() * k.element_size()
        ref = (k.view(torch.int32).long().sum() + v.view(torch.int32).long().sum()).item() % 2**32
        for heads, (block_n, warps), splits, stages in itertools.product(
                (1,) if args.head_major else (1, 2), ((16, 1), (32, 1), (64, 4), (128, 4), (128, 8), (256, 8)),
                args.splits, args.stages):
            if heads * block_n * k.element_size() > 64 * warps:  # K + V over 512 bytes per thread: register-bound
                continue
            fn = lambda: run_words(k, v, tables, heads, block_n, warps, splits, stages)  # noqa: E731
            try:
                exact = fn().long().sum().item() % 2**32 == ref
            except triton.runtime.errors.OutOfResources as e:  # shared memory of deep pipelines on wide tiles
                print(f"skip {block_n}/{warps} stages {stages}: {e}")
                continue
            ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
            row = dict(dtype=str(dtype).split(".")[-1], head_major=args.head_major, heads_per_program=heads,
                       block_n=block_n, warps=warps, splits=splits, stages=stages, us=ms * 1e3,
                       tb_per_s=nbytes / ms / 1e9, exact=exact)
            rows.append(row)
            print(f"words {'head-major ' if args.head_major else ''}{row['dtype']:<9} heads {heads} tile "
                  f"{block_n:>3}/{warps} splits {splits} stages {stages}: {row['us']:7.1f} us "
                  f"{row['tb_per_s']:.2f} TB/s (exact {exact})", flush=True)
        del k, v, tables
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--splits", type=int, nargs="+", default=[1, 4], help="KV splits per (sequence, head group)")
    p.add_argument("--head-major", action="store_true", help="pages stored [page, head, token, dim]: one head only")
    p.add_argument("--words", action="store_true", help="read int32 words, integer sums (reading alone)")
    p.add_argument("--stages", type=int, nargs="+", default=[1, 3], help="--words: software pipeline stages")
    args = p.parse_args(argv)
    rows = words_main(args) if args.words else float_probe(args)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "commit": os.environ.get("NANOCORE_GIT_COMMIT", ""), "shape": dict(seqs=SEQS, ctx=CTX, kv_heads=KV_HEADS,
           head_dim=HEAD_DIM, page=PAGE), "rows": rows}
    tag = ("" if args.splits == [1, 4] else "_splits" + "_".join(map(str, args.splits))) + (
        "_head_major" if args.head_major else "") + ("_words" if args.words else "")
    with open(os.path.join(args.outdir, f"decode_read_probe{tag}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


def float_probe(args) -> list[dict]:
    """Session 12's probe: float sums of every element (each one-byte element converted by ``cvt``)."""
    from triton.testing import do_bench
    rows = []
    for dtype in (torch.int8, torch.bfloat16):
        k, v, tables = case(dtype, args.head_major)
        nbytes = 2 * k.numel() * k.element_size()
        ref = (k.float().sum() + v.float().sum()).item()
        for heads, (block_n, warps), splits in itertools.product(
                (1,) if args.head_major else (1, 2, 4, 8), ((16, 1), (32, 1), (64, 1), (32, 4), (64, 4), (128, 4)),
                args.splits):
            if heads * block_n * k.element_size() > 64 * warps:  # K + V over 512 bytes per thread: register-bound
                continue
            out = run(k, v, tables, heads, block_n, warps, splits)
            err = abs(out.double().sum().item() - ref) / abs(ref)
            ms = do_bench(lambda: run(k, v, tables, heads, block_n, warps, splits), warmup=10, rep=40,
                          return_mode="median")
            row = dict(dtype=str(dtype).split(".")[-1], head_major=args.head_major, heads_per_program=heads, block_n=block_n, warps=warps,
                       splits=splits, us=ms * 1e3, tb_per_s=nbytes / ms / 1e9, rel_err=err)
            rows.append(row)
            print(f"{'head-major ' if args.head_major else ''}{row['dtype']:<9} heads {heads} tile {block_n:>3}/{warps} splits {splits}: {row['us']:7.1f} us "
                  f"{row['tb_per_s']:.2f} TB/s (sum rel err {err:.1e})", flush=True)
        del k, v, tables
    return rows


if __name__ == "__main__":
    sys.exit(main())
