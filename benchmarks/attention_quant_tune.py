"""Quantized-KV decode attention and KV store on one GPU: every variant checked, then timed; JSON out.

Usage (repo root, GPU machine): ``python3 benchmarks/attention_quant_tune.py OUTDIR [--budget-s 140]``
Expected wall time: about 120-130 s (most of it Triton compiles): it stops starting variants at ``--budget-s``
(default 120) and rewrites the JSON after every variant, so even a run killed at its limit leaves results.

1. check: every (layout, quant path, tile) against the torch reference (gather through the real codec +
   SDPA) on random mixed decode / prefill batches; relative error must stay under ``CHECK_TOL``.
2. decode: Qwen3-0.6B heads (16 q / 8 kv, head_dim 128), block 16, scattered blocks, per layer, at
   64 x 4096, 256 x 512 and 1 x 256 context: bf16 cache, then int8, fp8_e4m3, k_int8_v_fp8 with the old
   default ("fold" at the tile it ran with) and the fp16 paths over a few tiles (splits: heuristic).
3. store: the fused KV store per codec for 1 and 256 tokens (a decode step's worth).
Writes ``OUTDIR/attention_quant_tune.json`` and prints the best variant per (layout, shape) and the
variant the defaults pick, with its speedup over bf16.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import sys
import time

import torch
import triton
from triton.testing import do_bench

from nanocore.bench.report import git_commit
from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.kernels import paged_attention as pa
from nanocore.kernels.kv_store import store_kv
from nanocore.layers.attention import AttentionMetadata, paged_attention_reference

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16
DEVICE = "cuda"  # the CPU smoke test of this script swaps in "cpu" and the interpreter
SHAPES = {"64x4096": (64, 4096), "256x512": (256, 512), "1x256": (1, 256)}
CHECK_TOL = 2e-2  # relative L2 error vs the reference; the fp16 paths are nearer the reference than "fold"
TILES = [(128, 4, 2), (64, 4, 2), (128, 8, 2), (64, 2, 2), (32, 4, 2), (64, 4, 3)]
FULL_CHECK = ("default", "fold", "fp16_hwcvt")
OUT_PATH = "attention_quant_tune.json"


def codecs() -> dict:
    from nanocore_kv_quant.codecs import Fp8E4M3KVCodec, Int8KVCodec, KInt8VFp8KVCodec
    return {"bf16": UnquantizedKVCodec(), "int8": Int8KVCodec(), "fp8_e4m3": Fp8E4M3KVCodec(),
            "k_int8_v_fp8": KInt8VFp8KVCodec()}


def make_case(codec, specs, seed=0):
    """Random q and a paged cache written through ``codec.store`` (scattered blocks) for ``specs`` =
    [(query_len, seq_len), ...]; K/V at a few times unit scale, as a model's are."""
    torch.manual_seed(seed)
    blocks = [triton.cdiv(lk, BLOCK) for _, lk in specs]
    num_blocks = sum(blocks)
    cache = codec.allocate(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device(DEVICE))
    perm = torch.randperm(num_blocks, device=DEVICE, dtype=torch.int32)
    tables = torch.zeros(len(specs), max(blocks), dtype=torch.int32, device=DEVICE)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[used:used + n]
        used += n
    slots = (perm.long()[:, None] * BLOCK + torch.arange(BLOCK, device=DEVICE)).reshape(-1)
    kv = torch.randn(2, slots.numel(), KV_HEADS, HEAD_DIM, device=DEVICE) * 3
    codec.store(cache, kv[0].bfloat16(), kv[1].bfloat16(), slots)  # padding slots hold data: never read
    starts = torch.tensor([0] + [sum(lq for lq, _ in specs[:i + 1]) for i in range(len(specs))],
                          dtype=torch.int32, device=DEVICE)
    meta = AttentionMetadata(
        slot_mapping=torch.full((int(starts[-1]),), -1, dtype=torch.int64, device=DEVICE), query_start_loc=starts,
        seq_lens=torch.tensor([lk for _, lk in specs], dtype=torch.int32, device=DEVICE), block_tables=tables,
        max_query_len=max(lq for lq, _ in specs), max_seq_len=max(lk for _, lk in specs), kv_caches=[cache],
        codec=codec, query_lens_cpu=[lq for lq, _ in specs], seq_lens_cpu=[lk for _, lk in specs])
    q = torch.randn(int(starts[-1]), HEADS, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    return q, cache, meta


def run(q, cache, meta, codec, cfg):
    layout = codec.layout(torch.bfloat16) if codec.name != "unquantized" else None
    return pa.paged_attention(q, None, None, cache, meta, HEAD_DIM ** -0.5, layout=layout, config=cfg)


def variants(name: str) -> list[tuple[str, pa.AttentionConfig | None]]:
    """(label, config) per layout; None = the defaults. Most informative first (the budget may cut the tail)."""
    if name == "bf16":
        return [("default", None), ("(64, 4, 2) split 4", pa.AttentionConfig(16, 64, 4, 2, 4))]
    old_tile = pa.GROUP_K_DECODE_TILE if name == "k_int8_v_fp8" else pa.NARROW_DECODE_TILE
    out = [("default", None), (f"fold {old_tile}", pa.AttentionConfig(16, *old_tile, quant_path="fold"))]
    out += [(f"fp16_hwcvt {t}", pa.AttentionConfig(16, *t, quant_path="fp16_hwcvt")) for t in TILES]
    # forced split-KV: for the short 1 x 256 decode (8 programs); the other shapes only lose by it
    out += [(f"fp16_hwcvt ({n}, 4, 2) split {sp}", pa.AttentionConfig(16, n, 4, 2, sp, "fp16_hwcvt"))
            for n, sp in ((64, 4), (32, 8))]
    return out


#: Check batches: 40 decodes of mixed lengths (enough programs that no split is chosen, so the check shares
#: the timed kernel's compile), and a mixed prefill batch.
DECODE_CHECK = [(1, 1 + (977 * i) % 3001) for i in range(40)]
PREFILL_CHECK = [(200, 700), (1, 40), (64, 64), (0, 9)]


def rel_err(codec, specs, cfg, seed) -> float:
    q, cache, meta = make_case(codec, specs, seed=seed)
    out = run(q, cache, meta, codec, cfg).float()
    n = int(meta.query_start_loc[-1])
    ref = paged_attention_reference(q, None, None, cache, meta, HEAD_DIM ** -0.5).float()
    err = ((out[:n] - ref[:n]).norm() / ref[:n].norm()).item()
    return err if err == err else float("inf")  # NaN fails the check


def check(codec, cfg, first_of_path: bool) -> dict:
    """Relative error vs the torch reference on the decode batch; for the first variant of each path also
    on the prefill batch and on the decode batch with split-KV forced."""
    errs = {"decode": rel_err(codec, DECODE_CHECK, cfg, 1)}
    if first_of_path:
        path = cfg.quant_path if cfg is not None else None
        errs["prefill"] = rel_err(codec, PREFILL_CHECK, None if cfg is None else
                                  pa.AttentionConfig(64, 32, 4, 3, quant_path=path), 2)
        errs["split4"] = rel_err(codec, DECODE_CHECK[:6], pa.AttentionConfig(16, 128, 4, 2, 4, quant_path=path), 3)
    return {"rel_err": errs, "ok": max(errs.values()) < CHECK_TOL}


def time_decode(codec, label, cfg, cases, bench=None) -> dict:
    """Median ms per shape (one layer); bytes = the cache tensors (every K/V element and scale read once).
    ``bench`` (fn -> ms) replaces ``do_bench``, e.g. a CUDA-graph timer for kernels of a few us."""
    row = {}
    bench = bench or functools.partial(do_bench, warmup=10, rep=40, return_mode="median")
    for shape, (q, cache, meta, nbytes) in cases.items():
        ms = bench(lambda: run(q, cache, meta, codec, cfg))
        row[shape] = {"ms": ms, "tb_per_s": nbytes / ms / 1e9}
    return row


def time_store(codec) -> dict:
    row = {}
    for tokens in (1, 256):
        cache = codec.allocate(64, BLOCK, KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device(DEVICE))
        kv = torch.randn(tokens, 2 * KV_HEADS, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
        slots = torch.randperm(64 * BLOCK, device=DEVICE)[:tokens]
        k, v = kv[:, :KV_HEADS], kv[:, KV_HEADS:]  # strided views, as the model's qkv split gives
        layout = codec.layout(torch.bfloat16)
        row[f"{tokens}_tokens_kernel_us"] = 1e3 * do_bench(lambda: store_kv(cache, k, v, slots, layout),
                                                           warmup=5, rep=25, return_mode="median")
        row[f"{tokens}_tokens_codec_store_us"] = 1e3 * do_bench(lambda: codec.store(cache, k, v, slots),
                                                                warmup=5, rep=25, return_mode="median")
    return row


def decode_lens(n: int, ctx) -> list[int]:
    """Context lengths of an ``n``-sequence decode batch: ``ctx`` each, or for ``ctx = (lo, hi)`` uniform draws
    (seeded by ``n``: every layout, variant and script sees the same batch); ``(lo, hi, "longest_first")``: the
    same draws, longest sequence first (the grid then starts the longest programs first)."""
    if isinstance(ctx, tuple):
        rng = random.Random(n)
        lens = [rng.randint(ctx[0], ctx[1]) for _ in range(n)]
        return sorted(lens, reverse=True) if ctx[2:] == ("longest_first",) else lens
    return [ctx] * n


def decode_cases(codec) -> dict:
    """One decode batch per ``SHAPES`` entry (sequences, context as ``decode_lens`` reads it)."""
    cases = {}
    for shape, (n, ctx) in SHAPES.items():
        q, cache, meta = make_case(codec, [(1, lk) for lk in decode_lens(n, ctx)])
        cases[shape] = (q, cache, meta, sum(t.numel() * t.element_size() for t in cache.tensors()))
    return cases


def sweep(results: dict, deadline: float) -> None:
    """Variants rank by rank across the layouts (every layout's defaults first), so the budget cuts tails."""
    all_codecs = codecs()
    for name, codec in all_codecs.items():
        try:
            results["store"][name] = time_store(codec)
        except Exception as exc:
            results["store"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    cases = {name: decode_cases(codec) for name, codec in all_codecs.items()}
    order = sorted(((rank, name, label, cfg) for name in all_codecs
                    for rank, (label, cfg) in enumerate(variants(name))), key=lambda x: x[0])
    seen_paths = set()
    for rank, name, label, cfg in order:
        row = {"layout": name, "variant": label, "config": cfg.__dict__ if cfg else "default"}
        results["decode"].append(row)
        if rank > 1 and time.monotonic() > deadline:
            row["skipped"] = "budget"
            continue
        path = cfg.quant_path if cfg else "default"
        try:  # prefill and split checks (two more compiles) once per path the defaults or the tests use
            row["check"] = check(all_codecs[name], cfg, (name, path) not in seen_paths and path in FULL_CHECK)
            seen_paths.add((name, path))
            row["timing"] = time_decode(all_codecs[name], label, cfg, cases[name])
        except Exception as exc:  # a variant that fails to compile or run must not stop the sweep
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        write(results)  # a run killed at its time limit keeps what it measured


def summarize(results: dict) -> list[str]:
    runs = [r for r in results["decode"] if "timing" in r]
    bf16 = next((r["timing"] for r in runs if r["layout"] == "bf16"), {})
    lines, best = [], {}
    for r in runs:
        for shape, t in r["timing"].items():
            t["speedup_vs_bf16"] = bf16[shape]["ms"] / t["ms"] if shape in bf16 else None
    for name in codecs():
        for shape in SHAPES:
            ok = [r for r in runs if r["layout"] == name and r.get("check", {}).get("ok", name == "bf16")]
            if not ok:
                continue
            top = min(ok, key=lambda r: r["timing"][shape]["ms"])
            dflt = next((r for r in ok if r["variant"] == "default"), None)
            best[f"{name} {shape}"] = top["variant"]
            t, d = top["timing"][shape], dflt["timing"][shape] if dflt else None
            line = f"{name:<13} {shape:<8} best {t['ms'] * 1e3:7.1f} us x{t['speedup_vs_bf16'] or 0:4.2f} "
            line += f"{top['variant']:<34}"
            if d:
                line += f" default {d['ms'] * 1e3:7.1f} us x{d['speedup_vs_bf16'] or 0:4.2f}"
            lines.append(line)
    bad = [f"{r['layout']} {r['variant']}: {r.get('error') or r['check']}" for r in results["decode"]
           if "error" in r or ("check" in r and not r["check"]["ok"])]
    lines += [f"FAILED {b}" for b in bad]
    for name, st in results["store"].items():
        lines.append(f"store {name:<13} " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in st.items()))
    results["best"] = best
    return lines


def write(results: dict) -> None:
    with open(results["path"], "w") as f:
        json.dump(results, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--budget-s", type=float, default=120.0, help="stop adding decode variants after this")
    args = p.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    start = time.monotonic()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "python": platform.python_version(), "commit": git_commit(),
               "default_quant_path": pa.DEFAULT_QUANT_PATH, "narrow_decode_tile": pa.NARROW_DECODE_TILE,
               "heads": [HEADS, KV_HEADS, HEAD_DIM], "block_size": BLOCK, "shapes": SHAPES,
               "check_tol": CHECK_TOL, "decode": [], "store": {},
               "path": os.path.join(args.outdir, OUT_PATH)}
    try:
        sweep(results, start + args.budget_s - 10)  # a started variant takes a few seconds
    finally:
        lines = summarize(results)
        results["wall_s"] = time.monotonic() - start
        write(results)
        print("\n".join(lines))
        print(f"wrote {results['path']} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
