"""Where a one-byte decode step loses its bytes/s, one stage at a time (issue 17; GPU only, a diagnostic).

``python3 -m benchmarks.decode_ladder_probe OUTDIR``: the shape of ``decode_probe_shape`` (64 sequences x 4,096
tokens, 8 KV heads, head_dim 128, scattered pages of 16), GQA 2, and kernels that each do one more stage of decode
attention than the last, reading K and V through the block table as the engine's kernels do:

- ``convert``: the tiles converted to fp16 by the engine's conversions (``narrow_to_f16``) and summed;
- ``dots``: ``S = Q K^T`` and ``S V`` on tensor cores (a 16-row query tile holding the group's 2 rows);
- ``softmax``: the online softmax between the dots (the engine's kernels add only scales and masks to this);
- ``byte_qk``: ``dots`` with ``Q K^T`` on the stored bytes (int8 x int8 -> int32, or e4m3 x e4m3), Q quantized per row:
  what K costs when it never becomes fp16 (the SageAttention route; ``S V`` as in ``dots``).

Reading alone (``decode_read_probe --words``) reaches 3.7-4.0 TB/s at this shape at its best tiles and the engine's
one-byte kernels 2.7-2.9: the stages show where the difference goes. (``convert`` also widens and sums what the
engine's kernels do not: read it as an upper bound of the conversion's cost.) Each result is checked against torch. Writes
``OUTDIR/decode_ladder_probe.json``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl

from benchmarks import decode_probe_shape as shape
from benchmarks.decode_probe_shape import tile_rows
from nanocore.kernels.narrow_convert import narrow_to_f16

GROUP, ROWS = 2, 16  # query rows per KV head (Qwen3-0.6B), padded to the 16-row tile the engine's kernels use
LEVELS = {"convert": 1, "dots": 2, "softmax": 3, "byte_qk": 4}


@triton.jit
def _ladder_kernel(q_ptr, qb_ptr, qs_ptr, k_ptr, v_ptr, block_tables_ptr, acc_ptr, ml_ptr, seq_len, stride_bt, stride_blk,
                   stride_tok, num_splits, LEVEL: tl.constexpr, IS_INT8: tl.constexpr, CVT: tl.constexpr,
                   BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                   STAGES: tl.constexpr):
    seq, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = tl.arange(0, HEAD_DIM)
    rows = tl.arange(0, ROWS)
    prog = (seq * tl.num_programs(1) + head) * num_splits + split
    q_rows = (seq * tl.num_programs(1) + head) * ROWS + rows
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + cols[None, :])
    qb = tl.load(qb_ptr + q_rows[:, None] * HEAD_DIM + cols[None, :])  # Q quantized per row (``byte_qk``)
    qs = tl.load(qs_ptr + q_rows)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    m = tl.full([ROWS], -1e30, tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    for tile in tl.range(split * per_split, (split + 1) * per_split, num_stages=STAGES):
        tok_rows, ok = tile_rows(block_tables_ptr, seq, stride_bt, tile, seq_len, stride_blk, stride_tok, BLOCK_N,
                                 PAGE_SIZE)
        offs = tok_rows[:, None] + head * HEAD_DIM + cols[None, :]
        k_bytes = tl.load(k_ptr + offs, mask=ok[:, None], other=0.0)
        v = narrow_to_f16(tl.load(v_ptr + offs, mask=ok[:, None], other=0.0), IS_INT8, CVT)
        if LEVEL != 4:
            k = narrow_to_f16(k_bytes, IS_INT8, CVT)
        if LEVEL == 4:
            if IS_INT8:
                s = tl.dot(qb, tl.trans(k_bytes), out_dtype=tl.int32).to(tl.float32)
            else:
                s = tl.dot(qb, tl.trans(k_bytes))
            acc += tl.dot((s * qs[:, None]).to(tl.float16), v)
        elif LEVEL == 1:
            acc += tl.sum((k + v).to(tl.float32), 0)[None, :] / ROWS
        elif LEVEL == 2:
            acc += tl.dot(tl.dot(q, tl.trans(k)).to(tl.float16), v)
        else:
            s = tl.where(ok[None, :], tl.dot(q, tl.trans(k)), -1e30)
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            l = l * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
            m = m_new
    tl.store(acc_ptr + (prog * ROWS + rows)[:, None] * HEAD_DIM + cols[None, :], acc)
    tl.store(ml_ptr + (prog * 2) * ROWS + rows, m)
    tl.store(ml_ptr + (prog * 2 + 1) * ROWS + rows, l)


def case(is_int8: bool, device: str = "cuda"):
    """Token-major pages ``[pages, PAGE, heads, dim]`` (the engine's), scattered; queries ``[seqs, heads, ROWS,
    dim]`` fp16 with the group's ``GROUP`` rows set (the rest zero, as the engine pads a group to 16 rows)."""
    torch.manual_seed(0)
    dims = (shape.SEQS * shape.CTX // shape.PAGE, shape.PAGE, shape.KV_HEADS, shape.HEAD_DIM)
    if is_int8:
        k, v = (torch.randint(-100, 100, dims, dtype=torch.int8, device=device) for _ in range(2))
    else:  # finite e4m3 values only (random bytes would hold NaNs)
        k, v = ((torch.randn(dims, device=device) * 8).to(torch.float8_e4m3fn) for _ in range(2))
    q = torch.zeros(shape.SEQS, shape.KV_HEADS, ROWS, shape.HEAD_DIM, device=device)
    q[:, :, :GROUP] = torch.randn(shape.SEQS, shape.KV_HEADS, GROUP, shape.HEAD_DIM, device=device) * (
        0.01 if is_int8 else 0.1)
    return q.half(), k, v, shape.scattered_tables(device)


def quantized_q(q, k):
    """Q per row in K's byte format (int8: round to nearest of ``q / s``, ``s = amax / 127``; e4m3: ``amax / 448``),
    and ``s`` as fp32: ``Q K^T = s * (Q_bytes K^T)``."""
    qf = q.float()
    s = qf.abs().amax(-1).clamp_min(1e-8) / (127.0 if k.dtype == torch.int8 else 448.0)
    x = qf / s[..., None]
    return (x.round().to(torch.int8) if k.dtype == torch.int8 else x.to(k.dtype)), s.contiguous()


def run(q, k, v, tables, level, block_n, warps, splits, stages, cvt, qbs=None):
    """The stage's per-split results: ``acc`` ``[SEQS, heads, splits, ROWS, dim]`` and ``(m, l)`` per row."""
    seqs, heads, dim = shape.SEQS, shape.KV_HEADS, shape.HEAD_DIM
    qb, qs = qbs if qbs is not None else quantized_q(q, k)
    acc = torch.empty(seqs * heads * splits, ROWS, dim, dtype=torch.float32, device=q.device)
    ml = torch.empty(seqs * heads * splits, 2, ROWS, dtype=torch.float32, device=q.device)
    _ladder_kernel[(seqs, heads, splits)](
        q, qb, qs, k, v, tables, acc, ml, shape.CTX, tables.stride(0), k.stride(0), k.stride(1), splits,
        LEVEL=level, IS_INT8=k.dtype == torch.int8, CVT=cvt, BLOCK_N=block_n, PAGE_SIZE=shape.PAGE, HEAD_DIM=dim,
        ROWS=ROWS, STAGES=stages, num_warps=warps)
    return acc.view(seqs, heads, splits, ROWS, dim), ml.view(seqs, heads, splits, 2, ROWS)


def combine(acc, ml, level):
    """Per (sequence, head): the splits' partial results combined (``softmax``: rescaled by their maxima)."""
    if level != 3:
        return acc.sum(2)[:, :, :GROUP]
    m, l = ml[:, :, :, 0, :GROUP], ml[:, :, :, 1, :GROUP]
    w = torch.exp2(m - m.amax(2, keepdim=True))
    return (acc[:, :, :, :GROUP] * w[..., None]).sum(2) / (l * w).sum(2)[..., None]


def reference(q, k, v, tables, level):
    """The same stage in torch, fp32 over the gathered tokens (the kernel's fp16 roundings of S / P aside)."""
    kf, vf = (shape.gathered(x, tables).float().transpose(1, 2) for x in (k, v))  # [seq, head, tok, dim]
    if level == 1:
        return (kf + vf).sum(2)[:, :, None, :].expand(-1, -1, GROUP, -1) / ROWS
    if level == 4:
        qb, qs = quantized_q(q, k)
        s = (qb[:, :, :GROUP].float() @ kf.transpose(-1, -2)) * qs[:, :, :GROUP, None]
        return s.half().float() @ vf
    s = q[:, :, :GROUP].float() @ kf.transpose(-1, -2)
    if level == 2:
        return s @ vf
    return torch.softmax(s * math.log(2.0), -1) @ vf  # the kernel's exp2 scores


def probe(args) -> list[dict]:
    rows = []
    tiles = [tuple(int(x) for x in t.split("/")) for t in args.tiles]
    for is_int8, cvt in ((True, 1), (False, 2)):
        dtype = "int8" if is_int8 else "fp8_e4m3"
        if dtype not in args.dtypes:
            continue
        q, k, v, tables = case(is_int8)
        qbs = quantized_q(q, k)
        for name in args.levels:
            level = LEVELS[name]
            want = reference(q, k, v, tables, level)
            fp16_q = reference(q, k, v, tables, LEVELS["dots"]) if level == 4 else None  # what quantizing Q costs

            def errors(result, want=want, fp16_q=fp16_q, level=level):
                got = combine(*result, level)
                return [((got - w).norm() / w.norm()).item() if w is not None else None for w in (want, fp16_q)]
            for (block_n, warps), splits, stages in itertools.product(tiles, args.splits, args.stages):
                fn = lambda: run(q, k, v, tables, level, block_n, warps, splits, stages, cvt, qbs)  # noqa: E731
                result = shape.measure(fn, errors)
                if result is None:
                    continue
                (err, q_err), ms = result
                row = dict(dtype=dtype, level=name, block_n=block_n, warps=warps, splits=splits, stages=stages,
                           us=ms * 1e3, tb_per_s=2 * k.numel() / ms / 1e9, rel_err=err, rel_err_vs_fp16_q=q_err)
                rows.append(row)
                print(f"{dtype:<9} {name:<8} tile {block_n:>3}/{warps} splits {splits} stages {stages}: "
                      f"{row['us']:7.1f} us {row['tb_per_s']:.2f} TB/s (rel err {err:.1e}"
                      + (f", vs fp16 Q {q_err:.1e})" if q_err is not None else ")"), flush=True)
        del q, k, v, tables, qbs
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--levels", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    p.add_argument("--splits", type=int, nargs="+", default=[4])
    p.add_argument("--stages", type=int, nargs="+", default=[1, 3])
    p.add_argument("--tiles", nargs="+", default=["16/1", "32/1", "64/4"], help="BLOCK_N/warps")
    p.add_argument("--dtypes", nargs="+", default=["int8", "fp8_e4m3"], choices=["int8", "fp8_e4m3"])
    args = p.parse_args(argv)
    out = dict(shape.header(group=GROUP), rows=probe(args))
    with open(os.path.join(args.outdir, "decode_ladder_probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
