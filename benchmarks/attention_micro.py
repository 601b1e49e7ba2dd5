"""Microbenchmark of the Triton attention kernels on one GPU; prints a table and writes JSON.

- copy: a large device-to-device copy, the bandwidth ceiling (bytes read + written over time).
- prefill: plain causal prefill (default 16 x 1024 tokens, Qwen3-0.6B heads) against
  ``torch.nn.attention.varlen.varlen_attn``; FLOP/s counted over the causal half.
- decode: one token per sequence over a paged cache (default 64 x 4096); bytes = K + V read once.
- store: the fused KV store for a prefill's worth of tokens.
With ``--tune`` each kernel is also timed over a grid of tile configs.
"""
from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys

import torch
import triton
from triton.testing import do_bench

from nanocore.bench.report import git_commit
from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.interfaces import KVCache, KVLayout
from nanocore.kernels.kv_store import store_kv
from nanocore.kernels.paged_attention import AttentionConfig, default_config, paged_attention
from nanocore.layers.attention import AttentionMetadata


BENCH_MS = {"warmup": 25, "rep": 200}


def bench(fn) -> float:
    """Median milliseconds."""
    return do_bench(fn, warmup=BENCH_MS["warmup"], rep=BENCH_MS["rep"], return_mode="median")


def copy_bandwidth(gib: float = 2.0) -> dict:
    src = torch.randn(int(gib * 2**30) // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return {"bytes": 2 * src.numel() * 4, "ms": ms, "tb_per_s": 2 * src.numel() * 4 / ms / 1e9}


def paged_case(num_seqs, query_len, ctx_len, num_heads, num_kv_heads, head_dim, block_size, dtype,
               layout: KVLayout | None = None):
    """Random q and a paged cache (scattered blocks, ``layout``'s dtypes and scales) plus metadata."""
    seq_len = ctx_len
    blocks = triton.cdiv(seq_len, block_size)
    num_blocks = num_seqs * blocks
    codec = UnquantizedKVCodec()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    layout = layout or codec.layout(dtype)
    values = [(torch.randn(shape, device="cuda") * 20).clamp(-100, 100).to(dt)
              for dt in (layout.k_dtype, layout.v_dtype)]
    scales = [torch.rand(*shape[:3], layout.num_scale_groups(g, head_dim), device="cuda").to(layout.scale_dtype)
              if g != "none" else None for g in (layout.k_scale, layout.v_scale)]
    cache = KVCache(values[0], values[1], scales[0], scales[1])
    block_tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(num_seqs, blocks)
    starts = torch.arange(num_seqs + 1, device="cuda", dtype=torch.int32) * query_len
    meta = AttentionMetadata(
        slot_mapping=torch.full((num_seqs * query_len,), -1, dtype=torch.int64, device="cuda"),
        query_start_loc=starts, seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda"),
        block_tables=block_tables, max_query_len=query_len, max_seq_len=seq_len,
        kv_caches=[cache], codec=codec)
    q = torch.randn(num_seqs * query_len, num_heads, head_dim, device="cuda", dtype=dtype)
    return q, cache, meta


def varlen_baseline(q, k, v, cu, max_len, scale):
    """``varlen_attn`` causal, GQA natively when the installed signature allows it."""
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    kwargs = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if "scale" in params:
        kwargs["scale"] = scale
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    group = q.shape[1] // k.shape[1]
    if group > 1 and "enable_gqa" not in params:
        try:
            varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)
        except Exception:  # no native GQA in this build: give it full heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return (lambda: varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)), (k, v)


def prefill(args, results):
    n, L, hq, hkv, d = args.prefill_seqs, args.prefill_len, args.heads, args.kv_heads, args.head_dim
    dtype = torch.bfloat16
    scale = d ** -0.5
    q = torch.randn(n * L, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(n * L, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(n * L, hkv, d, device="cuda", dtype=dtype)
    meta = AttentionMetadata.for_prefill([L] * n, device="cuda")
    flops = 4 * n * hq * d * L * (L + 1) / 2
    row = {"num_seqs": n, "len": L, "heads": hq, "kv_heads": hkv, "head_dim": d, "flops": flops}
    base_fn, (kb, vb) = varlen_baseline(q, k, v, meta.query_start_loc, L, scale)
    ref = base_fn()
    ref = ref[0] if isinstance(ref, tuple) else ref
    row["varlen_ms"] = bench(base_fn)
    row["varlen_gqa_native"] = kb.shape[1] == hkv
    out = paged_attention(q, k, v, None, meta, scale)
    row["rel_err_vs_varlen"] = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    row["contig_ms"] = bench(lambda: paged_attention(q, k, v, None, meta, scale))
    qp, cache, pmeta = paged_case(n, L, L, hq, hkv, d, args.block_size, dtype)
    row["paged_ms"] = bench(lambda: paged_attention(qp, None, None, cache, pmeta, scale))
    row["default_config"] = default_config(L, hq // hkv, d).__dict__
    if args.tune:
        row["tune"] = []
        for bm in (64, 128):
            for bn in (32, 64):
                for warps in (4, 8):
                    for stages in (2, 3):
                        cfg = AttentionConfig(bm, bn, warps, stages)
                        try:
                            ms_c = bench(lambda: paged_attention(q, k, v, None, meta, scale, config=cfg))
                            ms_p = bench(lambda: paged_attention(qp, None, None, cache, pmeta, scale, config=cfg))
                        except Exception as exc:  # out of shared memory etc.
                            row["tune"].append({"config": cfg.__dict__, "error": str(exc)[:120]})
                            continue
                        row["tune"].append({"config": cfg.__dict__, "contig_ms": ms_c, "paged_ms": ms_p})
    for key in ("varlen", "contig", "paged"):
        row[f"{key}_tflops"] = flops / row[f"{key}_ms"] / 1e9
    results["prefill"] = row


def decode_cases(args):
    """(label, num_seqs, ctx, block_size, layout, configs) rows timed by ``decode``."""
    n, ctx = args.decode_seqs, args.decode_ctx
    tune = [AttentionConfig(16, bn, w, st, sp) for bn in (32, 64, 128) for w in (4, 8)
            for st in (2, 3) for sp in (1, 2, 4)] if args.tune else []
    int8 = KVLayout(torch.int8, torch.int8, "token_head", "token_head")
    fp8 = KVLayout(torch.float8_e4m3fn, torch.float8_e4m3fn, "token_head", "token_head")
    cases = [("bf16", n, ctx, bs, None, [None] + (tune if bs == args.block_size else []))
             for bs in sorted({16, args.block_size, 32, 64})]
    cases += [("int8_token_head", n, ctx, args.block_size, int8, [None]),
              ("fp8_token_head", n, ctx, args.block_size, fp8, [None])]
    few = [AttentionConfig(16, 64, 4, 2, sp) for sp in (1, 4, 16)]  # split-KV matters here
    cases += [("bf16_few_long", 4, 32768, args.block_size, None, [None] + few)]
    return cases


def decode(args, results, bandwidth):
    hq, hkv, d = args.heads, args.kv_heads, args.head_dim
    rows = []
    for label, n, ctx, block_size, layout, configs in decode_cases(args):
        q, cache, meta = paged_case(n, 1, ctx, hq, hkv, d, block_size, torch.bfloat16, layout)
        nbytes = sum(t.numel() * t.element_size() for t in cache.tensors()) + 2 * q.numel() * 2
        for cfg in configs:
            fn = lambda: paged_attention(q, q, q, cache, meta, d ** -0.5, layout=layout, config=cfg)  # noqa: E731
            try:
                ms = bench(fn)
            except Exception as exc:
                rows.append({"case": label, "block_size": block_size, "config": cfg.__dict__, "error": str(exc)[:120]})
                continue
            tbps = nbytes / ms / 1e9
            rows.append({"case": label, "num_seqs": n, "ctx": ctx, "block_size": block_size,
                         "config": cfg.__dict__ if cfg else "default", "ms": ms, "bytes": nbytes,
                         "tb_per_s": tbps, "frac_of_copy_bw": tbps / bandwidth})
    results["decode"] = {"heads": hq, "kv_heads": hkv, "head_dim": d, "runs": rows}


def store(args, results, bandwidth):
    t, hkv, d = args.prefill_seqs * args.prefill_len, args.kv_heads, args.head_dim
    codec = UnquantizedKVCodec()
    layout = codec.layout(torch.bfloat16)
    cache = codec.allocate(triton.cdiv(t, 16) + 8, 16, hkv, d, torch.bfloat16, torch.device("cuda"))
    kv = torch.randn(t, 2 * hkv, d, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(t, device="cuda")
    ms = bench(lambda: store_kv(cache, kv[:, :hkv], kv[:, hkv:], slots, layout))
    ms_ref = bench(lambda: codec.store(cache, kv[:, :hkv], kv[:, hkv:], slots))
    nbytes = 2 * 2 * t * hkv * d * 2
    results["store"] = {"tokens": t, "ms": ms, "torch_index_put_ms": ms_ref, "tb_per_s": nbytes / ms / 1e9,
                        "frac_of_copy_bw": nbytes / ms / 1e9 / bandwidth}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--tune", action="store_true")
    p.add_argument("--commit", default=None, help="recorded commit (default: the checkout's, or NANOCORE_GIT_COMMIT)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefill-seqs", type=int, default=16)
    p.add_argument("--prefill-len", type=int, default=1024)
    p.add_argument("--decode-seqs", type=int, default=64)
    p.add_argument("--decode-ctx", type=int, default=4096)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "python": platform.python_version(), "commit": args.commit or git_commit(), "args": vars(args)}
    results["copy"] = copy_bandwidth()
    bw = results["copy"]["tb_per_s"]
    prefill(args, results)
    decode(args, results, bw)
    store(args, results, bw)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print_table(results, bw)


def print_table(results, bw):
    pf = results["prefill"]
    print(f"{results['device']}  torch {results['torch']}  triton {results['triton']}  commit {results['commit']}")
    print(f"copy bandwidth              {bw:7.2f} TB/s")
    print(f"prefill varlen_attn         {pf['varlen_ms']:7.3f} ms  {pf['varlen_tflops']:6.1f} TFLOP/s")
    for key in ("contig", "paged"):
        print(f"prefill triton {key:<12} {pf[key + '_ms']:7.3f} ms  {pf[key + '_tflops']:6.1f} TFLOP/s  "
              f"x{pf[key + '_ms'] / pf['varlen_ms']:.2f} of varlen")
    if "tune" in pf:
        ok = [r for r in pf["tune"] if "paged_ms" in r]
        for key in ("contig_ms", "paged_ms"):
            best = min(ok, key=lambda r: r[key])
            print(f"prefill best {key:<14} {best[key]:7.3f} ms  {best['config']}")
    runs = [r for r in results["decode"]["runs"] if "ms" in r]
    for r in runs:
        if r["config"] == "default":
            print(f"decode {r['case']:<15} {r['num_seqs']}x{r['ctx']} bs={r['block_size']:<3} {r['ms']:7.3f} ms  "
                  f"{r['tb_per_s']:5.2f} TB/s ({100 * r['frac_of_copy_bw']:.0f}% of copy)")
    for label in sorted({r["case"] for r in runs}):
        best = min((r for r in runs if r["case"] == label), key=lambda r: r["ms"])
        print(f"decode best {label:<15} {best['ms']:7.3f} ms  {best['tb_per_s']:5.2f} TB/s  {best['config']}")
    st = results["store"]
    print(f"store {st['tokens']} tokens     {st['ms']:7.3f} ms  {st['tb_per_s']:5.2f} TB/s "
          f"(torch index_put {st['torch_index_put_ms']:.3f} ms)")


if __name__ == "__main__":
    sys.exit(main())
