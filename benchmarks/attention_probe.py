"""One decode-attention kernel run alone, for ``ncu`` (GPU only; diagnostics, not installed).

``python3 benchmarks/attention_probe.py LAYOUT [PATH] [--tile 16/1/1] [--seqs 64 --ctx 4096 --kv-heads 8 --heads 16]``
builds the case of ``attention_quant_tune.py`` (scattered blocks, random K/V through the codec) and runs the
kernel 6 times; profile the last with ``ncu -k regex:paged_attention --launch-skip 4 --launch-count 1``.
"""
from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import attention_quant_tune as aqt
from nanocore.kernels import paged_attention as pa
from nanocore.kernels.attention_config import _narrow_decode_tile


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("layout", choices=("bf16", "int8", "fp8_e4m3", "k_int8_v_fp8"))
    p.add_argument("path", nargs="?", default=None, help="quant path (default: the engine's)")
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--ctx-range", type=int, nargs=2, metavar=("LO", "HI"),
                   help="mixed lengths, uniform in [LO, HI] (the decode sweep's mixed batches), instead of --ctx")
    p.add_argument("--heads", type=int, default=aqt.HEADS)
    p.add_argument("--kv-heads", type=int, default=aqt.KV_HEADS)
    p.add_argument("--tile", default=None, help="block_n/num_warps/num_stages (default: the engine's for PATH)")
    p.add_argument("--time", action="store_true", help="print the median ms (do_bench) instead")
    args = p.parse_args(argv)
    aqt.HEADS, aqt.KV_HEADS = args.heads, args.kv_heads
    codec = aqt.codecs()[args.layout]
    ctx = tuple(args.ctx_range) if args.ctx_range else args.ctx
    q, cache, meta = aqt.make_case(codec, [(1, lk) for lk in aqt.decode_lens(args.seqs, ctx)])
    cfg = None
    if args.path:
        # the engine's one-token tile of many programs (the few-programs tile: --tile 32/4/3)
        tile = _narrow_decode_tile(args.path, args.layout == "k_int8_v_fp8", True, False)
        tile = tuple(int(x) for x in args.tile.split("/")) if args.tile else tile
        cfg = pa.AttentionConfig(16, *tile, quant_path=args.path)
    if args.time:
        from triton.testing import do_bench
        ms = do_bench(lambda: aqt.run(q, cache, meta, codec, cfg), warmup=10, rep=50, return_mode="median")
        nbytes = sum(t.numel() * t.element_size() for t in cache.tensors())
        print(f"{args.layout} {args.path or 'default'} {args.seqs}x{ctx} heads {args.heads}/{args.kv_heads}: "
              f"{ms * 1e3:.1f} us, {nbytes / ms / 1e9:.2f} TB/s")
        return 0
    for _ in range(6):
        aqt.run(q, cache, meta, codec, cfg)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
