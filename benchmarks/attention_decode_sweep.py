"""Decode attention over one-byte KV: a wide sweep of quant paths, tiles and forced KV splits (GPU only).

``python3 -m benchmarks.attention_decode_sweep OUTDIR [--workers 14]``: first every variant is compiled in
parallel worker processes (Triton's on-disk cache then serves the timing process), then each is checked
against the torch reference (``attention_quant_tune.rel_err``) and timed per layer at 64 x 4096 and 256 x 512
(``--variants cuda_core`` / ``grid``: also 1 x 16384) for GQA 2 (Qwen3-0.6B, 16 q / 8 kv heads), GQA 4
(Llama-3.1-8B, 32 / 8) and, except ``wide``, GQA 7 (Qwen2.5-7B, 28 / 4), with the bf16 cache's default as the
baseline. Writes ``OUTDIR/attention_decode_sweep.json`` after every group and prints the best variants.
Cases carry no ``decode_order``: "default" rows launch the batch order (the engine's longest-first grids are the
"lf" shapes of ``--variants mixed``, rows pre-sorted, with "|hf").
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

HEADS = {"gqa2": (16, 8), "gqa4": (32, 8), "gqa7": (28, 4)}
SHAPES = {"64x4096": (64, 4096), "256x512": (256, 512)}
LAYOUTS = ("int8", "fp8_e4m3", "k_int8_v_fp8")
PATHS = ("fold", "fp16_hwcvt")
TILES = [(128, 4, 2), (128, 8, 2), (128, 4, 3), (64, 4, 2), (64, 4, 3), (64, 2, 2), (64, 2, 3), (64, 8, 2),
         (32, 2, 3), (32, 4, 3), (32, 1, 3)]
SPLIT_TILES = [(64, 4, 3), (64, 2, 3), (32, 2, 3)]
#: second round (after the first showed 1-warp programs winning): 1-warp tiles x forced splits, fp16_hwcvt
ONE_WARP_TILES = [(32, 1, 3), (32, 1, 2), (16, 1, 3), (64, 1, 2)]
#: third round (session 12): the CUDA-core decode kernel (``narrow_decode``; its s12b run also had a next-tile
#: prefetch at stages 2, measured slower and removed)
CUDA_CORE_TILES = [(16, 1, 1), (8, 1, 1), (32, 1, 1), (16, 2, 1), (32, 4, 1)]
#: fourth round (session 12): the grid order of decode grids (``DECODE_HEADS_FIRST``), "|hf" = heads first
GRID_PATHS = ("default", "default|hf", "cuda_core", "cuda_core|hf")
CUDA_CORE_SHAPES = {"64x4096": (64, 4096), "256x512": (256, 512), "1x16384": (1, 16384)}
#: fifth round (session 14): batch 1 (TPOT's steps), GQA 2, timed as CUDA-graph replays (a few-us kernel launched
#: from Python would time the launch); the engine's default there was the 4-warp (128, 4, 2) tile, since this round
#: ``FEW_PROGRAMS_DECODE_TILE``
BATCH1_SHAPES = {"1x128": (1, 128), "1x1024": (1, 1024)}
BATCH1_TILES = [(128, 4, 2), (64, 4, 2), (64, 4, 3), (32, 4, 3), (64, 2, 2), (32, 2, 3), (32, 1, 3)]
#: seventh round (session 15): batch 1 at long contexts, where the few-programs tile splits 16-64 ways (s15a ncu at
#: 1 x 16K: its 512 4-warp programs fit 3 per SM, 1.29 waves, 45 us against bf16's 23 us), graph-timed
BATCH1_LONG_SHAPES = {"1x4096": (1, 4096), "1x16384": (1, 16384)}
BATCH1_LONG_TILES = [(32, 4, 3), (64, 4, 2), (128, 4, 2), (32, 2, 3), (32, 1, 3)]
BATCH1_LONG_SPLITS = (0, 8, 16, 32, 64)
#: eighth round (session 15, after the few-programs tile became 1-warp, split to one tile per split): short batch-1
#: contexts, session 14's 4-warp few-programs tile (32/4/3) against the 1-warp one, graph-timed
BATCH1_SHORT_SHAPES = {"1x128": (1, 128), "1x1024": (1, 1024)}
BATCH1_SHORT_TILES = [(32, 4, 3), (32, 1, 3)]
BATCH1_SHORT_SPLITS = (0, 4, 8, 16, 32)
#: the batch-1 rounds: (shapes, tiles, forced splits; 0 = the heuristic)
BATCH1_ROUNDS = {"batch1": (BATCH1_SHAPES, BATCH1_TILES, (0, 2, 4)),
                 "batch1long": (BATCH1_LONG_SHAPES, BATCH1_LONG_TILES, BATCH1_LONG_SPLITS),
                 "batch1short": (BATCH1_SHORT_SHAPES, BATCH1_SHORT_TILES, BATCH1_SHORT_SPLITS)}
#: sixth round (session 14): decode batches of mixed lengths, as the Nano-vLLM workload's steps (s14b timeline: 256 rows
#: at contexts 100..1,024 at its start, ~158 rows up to 1,521 later), where one 1-warp program per (sequence, KV head)
#: walks its whole context: 1-warp tiles x forced splits and 4-warp tiles, with the uniform 256 x 1024 as a check
MIXED_SHAPES = {"256xU100-1024": (256, (100, 1024)), "158xU300-1521": (158, (300, 1521)), "256x1024": (256, 1024),
                # session 15 (queued): the same draws longest first, with "default|hf" rows (KV heads on grid axis 0,
                # so the longest sequences' programs start first): what a longest-first order array would buy
                "256xU100-1024lf": (256, (100, 1024, "longest_first")),
                "158xU300-1521lf": (158, (300, 1521, "longest_first"))}
MIXED_TILES = [((32, 1, 3), 1), ((32, 1, 3), 2), ((32, 1, 3), 4), ((16, 1, 3), 2), ((32, 4, 3), 1), ((64, 4, 2), 1),
               ((32, 4, 3), 2)]


def shapes_of(which: str) -> dict:
    if which in BATCH1_ROUNDS:
        return BATCH1_ROUNDS[which][0]
    return {"cuda_core": CUDA_CORE_SHAPES, "grid": CUDA_CORE_SHAPES, "mixed": MIXED_SHAPES}.get(which, SHAPES)


def variants(which: str = "one_warp") -> list[tuple]:
    """(heads key, layout, path, (block_n, warps, stages), forced splits or 0 = the heuristic)."""
    heads = HEADS if which in ("one_warp", "cuda_core", "grid") else ("gqa2", "gqa4")
    heads = ("gqa2",) if which in BATCH1_ROUNDS or which == "mixed" else heads
    out = [(h, "bf16", "default", None, 0) for h in heads]
    out += [(h, "bf16", "default|hf", None, 0) for h in heads] if which == "mixed" else []
    if which == "grid":
        out += [(h, "bf16", "default|hf", None, 0) for h in heads]
        for h, layout in itertools.product(heads, LAYOUTS):
            out += [(h, layout, p, None if p.startswith("default") else (16, 1, 1), 0) for p in GRID_PATHS]
            out += [(h, layout, p, (32, 1, 1), 0) for p in ("cuda_core", "cuda_core|hf") if h != "gqa7"]
        return out
    for h, layout in itertools.product(heads, LAYOUTS):
        if which == "cuda_core":  # the engine's current default first, then the new kernel's tiles
            out += [(h, layout, "default", None, 0)]
            if h == "gqa7":  # 7 query rows per program: expected register-bound, two tiles to show it
                out += [(h, layout, "cuda_core", t, 0) for t in ((8, 1, 1), (16, 1, 1))]
                continue
            out += [(h, layout, "cuda_core", t, 0) for t in CUDA_CORE_TILES]
            out += [(h, layout, "cuda_core", (16, 1, 1), s) for s in (1, 2, 8)]
            continue
        if which == "mixed":
            out += [(h, layout, "default", None, 0), (h, layout, "default|hf", None, 0)]
            out += [(h, layout, "fp16_hwcvt", t, s) for t, s in MIXED_TILES]
            continue
        if which in BATCH1_ROUNDS:
            _, tiles, splits = BATCH1_ROUNDS[which]
            out += [(h, layout, "default", None, 0)]
            out += [(h, layout, "fp16_hwcvt", t, s) for t in tiles for s in splits]
            continue
        if which == "one_warp":
            out += [(h, layout, "fp16_hwcvt", t, s) for t in ONE_WARP_TILES for s in (0, 1, 4, 16)]
            continue
        for path in PATHS:
            out += [(h, layout, path, t, 0) for t in TILES]
            out += [(h, layout, path, t, s) for t in SPLIT_TILES for s in (2, 4, 8)]
    return out


def _setup(heads: str):
    from benchmarks import attention_quant_tune as aqt
    aqt.HEADS, aqt.KV_HEADS = HEADS[heads]
    aqt.SHAPES = shapes_of(os.environ.get("SWEEP_VARIANTS", ""))  # aqt.decode_cases / time_decode use these
    return aqt


def _config(path, tile, splits):
    from nanocore.kernels import paged_attention as pa
    heads_first, path = path.endswith("|hf"), path.removesuffix("|hf")
    return None if tile is None or path == "default" else pa.AttentionConfig(16, *tile, splits, path, heads_first)


def compile_group(args) -> str:
    """Worker: run every variant of one (heads, layout) once per shape, so its kernels are compiled to disk."""
    heads, layout, group = args
    aqt = _setup(heads)
    codec = aqt.codecs()[layout]
    cases = aqt.decode_cases(codec)
    errors = 0
    for _, _, path, tile, splits in group:
        for q, cache, meta, _ in cases.values():
            try:
                aqt.run(q, cache, meta, codec, _config(path, tile, splits))
            except Exception:  # the timing process records the error
                errors += 1
    return f"{heads} {layout}: {len(group)} variants, {errors} errors"


def time_group(heads: str, layout: str, group: list, rows: list) -> None:
    import torch
    aqt = _setup(heads)
    codec = aqt.codecs()[layout]
    cases = aqt.decode_cases(codec)
    bench = None
    if os.environ.get("SWEEP_VARIANTS", "").startswith("batch1"):
        from triton.testing import do_bench_cudagraph
        bench = functools.partial(do_bench_cudagraph, rep=40, return_mode="median")
    for _, _, path, tile, splits in group:
        cfg = _config(path, tile, splits)
        row = {"heads": heads, "layout": layout, "path": path, "tile": tile, "splits": splits}
        try:
            row["rel_err"] = aqt.rel_err(codec, aqt.DECODE_CHECK, cfg, 1)
            timed = aqt.time_decode(codec, None, cfg, cases, bench)
            row.update({shape: 1e3 * t["ms"] for shape, t in timed.items()})
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
    torch.cuda.empty_cache()


def summarize(rows: list) -> list[str]:
    shapes = shapes_of(os.environ.get("SWEEP_VARIANTS", ""))
    base = {(r["heads"], s): r[s] for r in rows if r["layout"] == "bf16" and r["path"] == "default" and "error" not in r
            for s in shapes}
    lines = []
    for heads, layout, shape in itertools.product(HEADS, LAYOUTS, shapes):
        if (heads, shape) not in base:
            if any(r["heads"] == heads and r["layout"] == layout for r in rows):
                lines.append(f"{heads} {layout} {shape}: no bf16 baseline (its row failed or is missing)")
            continue
        ok = [r for r in rows if r["heads"] == heads and r["layout"] == layout and shape in r
              and r.get("rel_err", 1) < 2e-2]
        best = sorted(ok, key=lambda r: r[shape])[:3]
        for r in best + [r for r in ok if r["path"].startswith("default") and r not in best]:
            lines.append(f"{heads} {layout:<13} {shape:<8} {r[shape]:7.1f} us x{r[shape] / base[(heads, shape)]:.2f} "
                         f"bf16  {r['path']} {r['tile']} split {r['splits']}")
    for r in rows:
        if r["layout"] == "bf16" and "error" not in r:
            lines.append(f"{r['heads']} bf16 {r['path']}: " + ", ".join(f"{s} {r[s]:.1f} us" for s in shapes if s in r))
    lines += [f"FAILED {r}" for r in rows if "error" in r or r.get("rel_err", 0) >= 2e-2]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--variants", choices=("wide", "one_warp", "cuda_core", "grid", *BATCH1_ROUNDS, "mixed"),
                   default="one_warp",
                   help="wide: the first round (paths x tiles x splits); one_warp: 1-warp tiles x splits; "
                        "cuda_core: the CUDA-core decode kernel's tiles against the engine's default; "
                        "grid: heads-first grid order against the default order; batch1: tiles x splits of "
                        "batch-1 steps, graph-timed (batch1long: at 4K and 16K context, up to 64 splits; batch1short: 128 "
                        "and 1K, the 4-warp and 1-warp few-programs tiles); mixed: decode "
                        "batches of mixed lengths")
    args = p.parse_args(argv)
    os.environ["SWEEP_VARIANTS"] = args.variants  # the spawned compile workers read it too
    start = time.monotonic()
    groups = {}
    for v in variants(args.variants):
        groups.setdefault((v[0], v[1]), []).append(v)
    # compile: split each (heads, layout) group in chunks so the workers share the load
    jobs = [(h, lay, g[i::4]) for (h, lay), g in groups.items() for i in range(4) if g[i::4]]
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        for msg in pool.map(compile_group, jobs):
            print("compiled", msg, flush=True)
    print(f"compile phase {time.monotonic() - start:.0f} s", flush=True)
    import torch
    import triton
    rows: list = []
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "commit": os.environ.get("NANOCORE_GIT_COMMIT", ""), "heads": HEADS,
           "shapes": shapes_of(args.variants), "rows": rows}
    path = os.path.join(args.outdir, f"attention_decode_sweep_{args.variants}.json")
    for (h, lay), g in groups.items():
        time_group(h, lay, g, rows)
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    lines = summarize(rows)
    out["summary"] = lines
    out["wall_s"] = time.monotonic() - start
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("\n".join(lines))
    print(f"wrote {path} in {out['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
