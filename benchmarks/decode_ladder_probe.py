"""Where a one-byte decode step loses its bytes/s, one stage at a time (issue 17; GPU only, a diagnostic).

``python3 -m benchmarks.decode_ladder_probe OUTDIR``: the shape of ``decode_read_probe`` (64 sequences x 4,096
tokens, 8 KV heads, head_dim 128, scattered pages of 16, GQA 2), and kernels that each do one more stage of decode
attention than the last, reading K and V through the block table as the engine's kernels do:

- ``convert``: the tiles converted to fp16 by the engine's conversions (``narrow_to_f16``) and summed;
- ``dots``: ``S = Q K^T`` and ``S V`` on tensor cores (a 16-row query tile holding the group's 2 rows);
- ``softmax``: the online softmax between the dots (the engine's kernels add only scales and masks to this);
- ``byte_qk``: ``dots`` with ``Q K^T`` on the stored bytes (int8 x int8 -> int32, or e4m3 x e4m3), Q quantized per row:
  what K costs when it never becomes fp16 (the SageAttention route; ``S V`` as in ``dots``).

Reading alone (``decode_read_probe --words``) reaches ~4.0 TB/s at this shape and the engine's one-byte kernels
2.7-2.9, so the first stage that falls to ~2.8 is the limiter. Each result is checked against torch. Writes
``OUTDIR/decode_ladder_probe.json``.
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

from nanocore.kernels.narrow_convert import narrow_to_f16

SEQS, CTX, KV_HEADS, HEAD_DIM, PAGE, GROUP, ROWS = 64, 4096, 8, 128, 16, 2, 16
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
        pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = pos < seq_len
        blk = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE_SIZE, mask=ok, other=0)
        offs = (blk.to(tl.int64) * stride_blk + (pos % PAGE_SIZE) * stride_tok)[:, None] + head * HEAD_DIM + cols[None, :]
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
    pages = SEQS * CTX // PAGE
    shape = (pages, PAGE, KV_HEADS, HEAD_DIM)
    if is_int8:
        k, v = (torch.randint(-100, 100, shape, dtype=torch.int8, device=device) for _ in range(2))
    else:  # finite e4m3 values only (random bytes would hold NaNs)
        k, v = ((torch.randn(shape, device=device) * 8).to(torch.float8_e4m3fn) for _ in range(2))
    q = torch.zeros(SEQS, KV_HEADS, ROWS, HEAD_DIM, device=device)
    q[:, :, :GROUP] = torch.randn(SEQS, KV_HEADS, GROUP, HEAD_DIM, device=device) * (0.01 if is_int8 else 0.1)
    tables = torch.randperm(pages, device=device, dtype=torch.int32).view(SEQS, CTX // PAGE)
    return q.half(), k, v, tables


def quantized_q(q, k):
    """Q per row in K's byte format (int8: round to nearest of ``q / s``, ``s = amax / 127``; e4m3: ``amax / 448``),
    and ``s`` as fp32: ``Q K^T = s * (Q_bytes K^T)``."""
    qf = q.float()
    s = qf.abs().amax(-1).clamp_min(1e-8) / (127.0 if k.dtype == torch.int8 else 448.0)
    x = qf / s[..., None]
    return (x.round().to(torch.int8) if k.dtype == torch.int8 else x.to(k.dtype)), s.contiguous()


def run(q, k, v, tables, level, block_n, warps, splits, stages, cvt, qbs=None):
    progs = SEQS * KV_HEADS * splits
    qb, qs = qbs if qbs is not None else quantized_q(q, k)
    acc = torch.empty(progs, ROWS, HEAD_DIM, dtype=torch.float32, device=q.device)
    ml = torch.empty(progs, 2, ROWS, dtype=torch.float32, device=q.device)
    _ladder_kernel[(SEQS, KV_HEADS, splits)](
        q, qb, qs, k, v, tables, acc, ml, k.shape[0] * PAGE // SEQS, tables.stride(0), k.stride(0), k.stride(1), splits,
        LEVEL=level, IS_INT8=k.dtype == torch.int8, CVT=cvt, BLOCK_N=block_n, PAGE_SIZE=PAGE, HEAD_DIM=HEAD_DIM,
        ROWS=ROWS, STAGES=stages, num_warps=warps)
    return acc.view(SEQS, KV_HEADS, splits, ROWS, HEAD_DIM), ml.view(SEQS, KV_HEADS, splits, 2, ROWS)


def combine(acc, ml, level):
    """Per (sequence, head): the splits' partial results combined (``softmax``: rescaled by their maxima)."""
    if level != 3:
        return acc.sum(2)[:, :, :GROUP]
    m, l = ml[:, :, :, 0, :GROUP], ml[:, :, :, 1, :GROUP]
    w = torch.exp2(m - m.amax(2, keepdim=True))
    return (acc[:, :, :, :GROUP] * w[..., None]).sum(2) / (l * w).sum(2)[..., None]


def reference(q, k, v, tables, level):
    """The same stage in torch, fp32 over the gathered tokens (the kernel's fp16 roundings of S / P aside)."""
    slots = (tables.long()[:, :, None] * PAGE + torch.arange(PAGE, device=q.device)).view(SEQS, -1)
    kf, vf = (x.float().view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(1, 2) for x in (k, v))  # [seq, head, tok, dim]
    if level == 1:
        return (kf + vf).sum(2)[:, :, None, :].expand(-1, -1, GROUP, -1) / ROWS
    if level == 4:
        qb, qs = quantized_q(q, k)
        s = (qb[:, :, :GROUP].float() @ kf.transpose(-1, -2)) * qs[:, :, :GROUP, None]
        return s.half().float() @ vf
    s = q[:, :, :GROUP].float() @ kf.transpose(-1, -2)
    if level == 2:
        return s @ vf
    return torch.softmax(s * torch.log(torch.tensor(2.0)), -1) @ vf


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--levels", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    p.add_argument("--splits", type=int, nargs="+", default=[4])
    p.add_argument("--stages", type=int, nargs="+", default=[1, 3])
    p.add_argument("--tiles", nargs="+", default=["16/1", "32/1", "64/4"], help="BLOCK_N/warps")
    p.add_argument("--dtypes", nargs="+", default=["int8", "fp8_e4m3"], choices=["int8", "fp8_e4m3"])
    args = p.parse_args(argv)
    from triton.testing import do_bench
    rows = []
    tiles = [tuple(int(x) for x in t.split("/")) for t in args.tiles]
    for is_int8, cvt in ((True, 1), (False, 2)):
        if ("int8" if is_int8 else "fp8_e4m3") not in args.dtypes:
            continue
        q, k, v, tables = case(is_int8)
        nbytes = 2 * k.numel()
        for name, (block_n, warps), splits, stages in itertools.product(
                args.levels, tiles, args.splits, args.stages):
            level = LEVELS[name]
            qbs = quantized_q(q, k)
            fn = lambda: run(q, k, v, tables, level, block_n, warps, splits, stages, cvt, qbs)  # noqa: E731
            try:
                got = combine(*fn(), level)
            except triton.runtime.errors.OutOfResources as e:
                print(f"skip {name} {block_n}/{warps}/{stages}: {e}")
                continue
            want = reference(q, k, v, tables, level)
            err = ((got - want).norm() / want.norm()).item()
            # byte_qk: also its distance from fp16 Q's result, i.e. what quantizing Q costs
            fp16_q = reference(q, k, v, tables, LEVELS["dots"]) if level == 4 else want
            q_err = ((got - fp16_q).norm() / fp16_q.norm()).item()
            ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
            row = dict(dtype="int8" if is_int8 else "fp8_e4m3", level=name, block_n=block_n, warps=warps,
                       splits=splits, stages=stages, us=ms * 1e3, tb_per_s=nbytes / ms / 1e9, rel_err=err,
                       rel_err_vs_fp16_q=q_err)
            rows.append(row)
            print(f"{row['dtype']:<9} {name:<8} tile {block_n:>3}/{warps} splits {splits} stages {stages}: "
                  f"{row['us']:7.1f} us {row['tb_per_s']:.2f} TB/s (rel err {err:.1e}, vs fp16 Q {q_err:.1e})", flush=True)
        del q, k, v, tables
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "commit": os.environ.get("NANOCORE_GIT_COMMIT", ""), "shape": dict(seqs=SEQS, ctx=CTX, kv_heads=KV_HEADS,
           head_dim=HEAD_DIM, page=PAGE, group=GROUP), "rows": rows}
    with open(os.path.join(args.outdir, "decode_ladder_probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
