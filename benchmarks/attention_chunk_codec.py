"""Prefill attention with a KV codec on one GPU: a chunk reading its own K/V fresh vs back through the codec.

Usage (repo root, GPU machine): ``python3 benchmarks/attention_chunk_codec.py OUTDIR`` (about a minute, mostly
compiles). Per layer, Qwen3-0.6B heads (16 q / 8 kv, head_dim 128), block 16, scattered blocks, bf16 queries:

- ``first 8x4096``: 8 fresh prompts of 4,096 tokens (no cached prefix: the codec's cache is not read at all);
- ``chunk 8x2048+2048``: 8 chunks of 2,048 tokens after 2,048 cached tokens each.

For the bf16 cache and each codec (int8, fp8_e4m3, k_int8_v_fp8) it times ``fresh`` (the chunk's own K/V from
``k_new``/``v_new``, what the engine runs) and ``from_cache`` (every position through the codec: ``eval ppl``'s
path and the engine's behaviour before), checks both against the torch reference, and prints each time over
bf16's. Writes ``OUTDIR/attention_chunk_codec.json``. ``--smoke`` runs tiny shapes on CPU (Triton interpreter, fp16).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

CODECS = ("unquantized", "int8", "fp8_e4m3", "k_int8_v_fp8")
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16
CASES = {"first 8x4096": (8, 4096, 0), "chunk 8x2048+2048": (8, 2048, 2048)}
SMOKE_CASES = {"first 2x24": (2, 24, 0), "chunk 2x16+21": (2, 16, 21)}


def make_case(codec, num_seqs: int, query_len: int, ctx_len: int, device: str, dtype: torch.dtype, seed: int = 0):
    """q, k_new, v_new and a cache whose every position was stored through ``codec`` (scattered blocks)."""
    from nanocore.layers.attention import AttentionMetadata, block_slots
    g = torch.Generator().manual_seed(seed)
    seq_len = ctx_len + query_len
    blocks = -(-seq_len // BLOCK)
    cache = codec.allocate(num_seqs * blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype, torch.device(device))
    tables = torch.randperm(num_seqs * blocks, generator=g).int().view(num_seqs, blocks).to(device)
    k = torch.randn(num_seqs, seq_len, KV_HEADS, HEAD_DIM, generator=g).to(device, dtype)
    v = torch.randn(num_seqs, seq_len, KV_HEADS, HEAD_DIM, generator=g).to(device, dtype)
    for b in range(num_seqs):
        codec.store(cache, k[b], v[b], block_slots(tables[b], seq_len, BLOCK))
    meta = AttentionMetadata(
        slot_mapping=torch.full((num_seqs * query_len,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32, device=device) * query_len,
        seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device), block_tables=tables,
        max_query_len=query_len, max_seq_len=seq_len, kv_caches=[cache], codec=codec,
        query_lens_cpu=[query_len] * num_seqs, seq_lens_cpu=[seq_len] * num_seqs)
    q = torch.randn(num_seqs * query_len, HEADS, HEAD_DIM, generator=g).to(device, dtype)
    new = lambda x: x[:, ctx_len:].reshape(-1, KV_HEADS, HEAD_DIM)  # noqa: E731
    return q, new(k), new(v), cache, meta


def timed_ms(fn, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(name: str, case: tuple[int, int, int], device: str) -> list[dict]:
    from nanocore.kernels.paged_attention import paged_attention
    from nanocore.layers.attention import paged_attention_reference
    from nanocore.plugins import get_registry
    codec = get_registry().instantiate(get_registry().get("kv_codec", name))
    dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong
    q, k_new, v_new, cache, meta = make_case(codec, *case, device, dtype)
    layout, scale, rows = codec.layout(dtype), HEAD_DIM ** -0.5, []
    for mode in ("fresh", "from_cache"):
        meta.kv_from_cache = mode == "from_cache"
        fn = lambda: paged_attention(q, k_new, v_new, cache, meta, scale, layout=layout)  # noqa: E731
        out, ref = fn().float(), paged_attention_reference(q, k_new, v_new, cache, meta, scale).float()
        rows.append({"codec": name, "mode": mode, "ms": timed_ms(fn, device),
                     "rel_err": ((out - ref).norm() / ref.norm()).item()})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (Triton interpreter)")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from nanocore.bench.report import git_commit
    results = {"commit": git_commit(), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "heads": [HEADS, KV_HEADS, HEAD_DIM], "block_size": BLOCK, "cases": {}}
    for label, case in (SMOKE_CASES if args.smoke else CASES).items():
        rows = [row for name in CODECS for row in measure(name, case, device)]
        base = next(r["ms"] for r in rows if r["codec"] == "unquantized" and r["mode"] == "fresh")
        for r in rows:
            r["x_bf16"] = r["ms"] / base
            print(f"{label:<18} {r['codec']:<13} {r['mode']:<10} {r['ms']:8.3f} ms  x{r['x_bf16']:.2f} of bf16  "
                  f"rel_err {r['rel_err']:.1e}")
        results["cases"][label] = rows
    args.outdir.mkdir(parents=True, exist_ok=True)
    (args.outdir / "attention_chunk_codec.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["rel_err"] < 2e-2 for rows in results["cases"].values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
