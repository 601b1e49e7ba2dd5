"""Launch configuration of the paged-attention kernels: tiles, split-KV and the quantized-KV path.

No kernels here, so the choices and their measured reasons read in one place; ``paged_attention`` re-exports
the names its callers use. Everything is an argument or a named constant: nothing is read from the environment.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton

#: How quantized K/V tiles meet the dots (``AttentionConfig.quant_path``; None picks ``DEFAULT_QUANT_PATH``):
#: "fold": per-(token, head) scales go on the score / probability columns, a group-scaled K is read as
#: head_dim / group column slices, one dot each, scaled per score column (groups of 16+ elements, a power of two;
#: narrower groups are dequantized in registers before the dot);
#: "fp16_hwcvt": one-byte K and V are converted to fp16 (fp8 by the hardware's e4m3x2 -> f16x2 instruction where the
#: GPU has one, sm_89+, else with integer bit tricks) and both dots run in fp16, scales folded (``narrow_attention``);
#: layouts it does not cover (wider elements, fp32 queries, K groups under 16) take "fold".
QUANT_PATHS = ("fold", "fp16_hwcvt")
#: Path of prefill tiles and of decode-shaped chunks of 2+ tokens: fastest at 256 x 512 for every layout with
#: 4-warp tiles (H200, measured with the attention tuning sweep at dfa4d10; git history holds its JSON).
DEFAULT_QUANT_PATH = "fold"
#: Path of the one-byte decode tile: H200 per layer at 256 x 512, GQA 2 / 4 (docs/data/attention/decode_sweep.json):
#: 112-116 us at (32, 1, 3) for int8, fp8_e4m3 and k_int8_v_fp8 alike, "fold" at the same tile 116-178 us.
DECODE_QUANT_PATH = "fp16_hwcvt"
#: Decode tiles (block_n, num_warps, num_stages) when K and V are stored in one byte per element. One warp per
#: program: the 4-warp tiles (ncu, 64 x 4K, fp8 128/4/2: 255 registers with spills, 8 warps per SM,
#: 67% of cycles with no eligible warp, DRAM at 49%) were latency-bound; 32 keys per 1-warp program keep many
#: small programs resident and need no cross-warp reductions per tile. Long contexts split the KV range so that
#: enough warps run (``choose_num_splits``).
NARROW_DECODE_TILE = (32, 1, 3)
#: "fold"'s tile for group-scaled K (k_int8_v_fp8) in decode-shaped batches with a chunk of 2+ tokens.
GROUP_K_DECODE_TILE = (64, 4, 2)
#: The 4-warp one-byte tile of decode-shaped batches with a chunk of 2+ tokens (up to 64 rows; H200, "fold": int8 /
#: fp8 128/4/2): one warp would hold a 64-row accumulator (sm_90 compile: 3.5 KB of stack, 15 s per variant).
WIDE_NARROW_TILE = (128, 4, 2)
#: Pure decode with fewer 1-warp programs than SMs (sequences x KV heads, before splitting: batch 1 to ~16) and contexts
#: up to ``FEW_PROGRAMS_MAX_SEQ_LEN`` (under decode graphs: their context tier): a few programs walk their keys tile
#: after tile, so the chain per program sets the time; 4-warp 32-key programs, split down to one tile per split.
#: H200, graph-timed per layer, GQA 2 (bf16 5.0 / 9.9 us at 1 x 128 / 1 x 1,024): int8 9.7 us at 1 x 1,024 (8 splits)
#: against the 128-key tile's 15.3 and the 1-warp tile's 18.1 (4 splits of 256+ keys); at 1 x 128 this tile split
#: 4-8 ways 6.0-6.8 us against the 1-warp tile's 7.8-8.6 at any split count; TPOT 128 / 128 (``max_model_len``
#: 1,024) k_int8_v_fp8 1.515 ms with it, 1.572 with the 1-warp tile split 32 ways, bf16 1.467. Longer contexts take
#: the 1-warp tile, split down to one or two tiles per split (``choose_num_splits``): this tile ran 1.46-1.65x bf16
#: at 1 x 16K (64 splits of 4-warp programs at 168 registers: 1.29 waves) and 1.10-1.37x at 1 x 4K, where the 1-warp
#: tile split 64 ways ran 0.76-0.83x / 0.96-0.99x (TPOT at 16K: k_int8_v_fp8 2.129 ms, bf16 2.039).
FEW_PROGRAMS_DECODE_TILE = (32, 4, 3)
FEW_PROGRAMS_MAX_SEQ_LEN = 1024
#: Launch order of a pure-decode grid's sequences (``EngineConfig.attention_decode_order``): "longest_first" (the
#: default on CUDA: the step's ``AttentionMetadata.decode_order``, longest context first, with the KV heads on grid
#: axis 0, so the longest sequences' programs start in the first wave and short ones fill the tail:
#: longest-processing-time-first; with KV splits, splits stay the slowest grid axis, so the order holds within each
#: split) or "batch" (the batch's rows in order). H200, Nano-vLLM workload, output tok/s, one call: k_int8_v_fp8
#: 21,500 -> 24,280 (0.889x -> 1.004x bf16), bf16 24,180 -> 24,210; the decode kernel on the workload's mixed-length
#: batches (GQA 2, per layer) 0.81-0.90x bf16 where the batch order ran 1.06-1.15x.
DECODE_ORDERS = ("batch", "longest_first")
DEFAULT_DECODE_ORDER = "longest_first"
#: Grid order of decode-shaped grids (one query tile per sequence) without a decode order: the sequences on grid
#: axis 0 (``AttentionConfig.heads_first`` True puts a sequence's KV heads next to each other instead).
DECODE_HEADS_FIRST = False


@dataclass(frozen=True)
class AttentionConfig:
    """Tile shape and launch parameters; ``num_splits`` 0 lets the heuristic choose; ``quant_path`` None
    means ``DEFAULT_QUANT_PATH`` (it only matters for layouts with scales)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int = 0
    quant_path: str | None = None
    heads_first: bool | None = None  # grid order of decode-shaped grids; None: ``DECODE_HEADS_FIRST``


def fp16_path(path: str) -> bool:
    """One-byte K/V reach the dots as fp16 on this path (``narrow_attention``)."""
    return path == "fp16_hwcvt"


def _narrow_decode_tile(quant_path: str, k_grouped: bool, one_token: bool, few_programs: bool) -> tuple[int, int, int]:
    """Tile of a one-byte cache's decode-shaped batch (``few_programs``: fewer sequences x KV heads than SMs, contexts
    up to ``FEW_PROGRAMS_MAX_SEQ_LEN``)."""
    if k_grouped and not fp16_path(quant_path):
        return GROUP_K_DECODE_TILE
    if not one_token:
        return WIDE_NARROW_TILE
    return FEW_PROGRAMS_DECODE_TILE if few_programs else NARROW_DECODE_TILE


def default_config(max_query_len: int, group: int, head_dim: int, kv_itemsize: int = 2,
                   k_grouped: bool = False, few_programs: bool = False, max_seq_len: int = 0) -> AttentionConfig:
    """Decode-shaped batches get a small M tile (the GQA group); prefill gets flash-attention tiles. A one-byte
    cache's decode-shaped tiles carry their path (``DECODE_QUANT_PATH`` for one token, else ``DEFAULT_QUANT_PATH``);
    prefill tiles leave it None. ``few_programs``: fewer sequences x KV heads than SMs; with ``max_seq_len`` up to
    ``FEW_PROGRAMS_MAX_SEQ_LEN`` (0: unknown, taken as short) they get the few-programs tile."""
    rows = max_query_len * group
    if rows <= 64 and kv_itemsize == 1:
        one_token = max_query_len <= 1 and rows <= 16  # pure decode steps: the measured 1-warp tile
        path = DECODE_QUANT_PATH if one_token else DEFAULT_QUANT_PATH
        short = max_seq_len <= FEW_PROGRAMS_MAX_SEQ_LEN
        tile = _narrow_decode_tile(path, k_grouped, one_token, few_programs and short)
        return AttentionConfig(max(16, triton.next_power_of_2(rows)), *tile, quant_path=path)
    if rows <= 64:  # H200, 64 x 4K decode: 2 stages 4.23 TB/s, 3 stages 3.15 (smem limits occupancy)
        return AttentionConfig(max(16, triton.next_power_of_2(rows)), 64, 4, 2)
    # H200, 16 x 1024 prefill, paged: 64/32/4/3 0.286 ms, 128/64/8/3 0.327 ms
    return AttentionConfig(max(64, triton.next_power_of_2(group)), 32, 4, 3)


def decode_order_mode(device_type: str, requested: str = "auto") -> str:
    """The decode order a runner on ``device_type`` uses (``EngineConfig.attention_decode_order``): "auto" is
    ``DEFAULT_DECODE_ORDER`` on CUDA and "batch" elsewhere (the torch reference path never reads the order)."""
    if requested == "auto":
        return DEFAULT_DECODE_ORDER if device_type == "cuda" else "batch"
    if requested not in DECODE_ORDERS:
        raise ValueError(f"attention_decode_order {requested!r} is not one of {('auto', *DECODE_ORDERS)}; leave it "
                         f"'auto' for the default ({DEFAULT_DECODE_ORDER} on CUDA)")
    return requested


def longest_first(seq_lens) -> np.ndarray:
    """Row indices of a decode batch, longest context first (ties in batch order): ``decode_order``'s values."""
    return np.argsort(-np.asarray(seq_lens, dtype=np.int64), kind="stable")


def _pow2_at_most(n: int) -> int:
    """The largest power of two <= ``n`` (1 for n < 2): split counts never exceed the tiles they share."""
    return 1 << (n.bit_length() - 1) if n > 1 else 1


def choose_num_splits(programs: int, max_seq_len: int, block_n: int, sm_count: int, num_warps: int = 4,
                      decode: bool = False) -> int:
    """Split the KV range when the grid would not fill the GPU and contexts are long (flash-decoding).

    4-warp programs: below 2 per SM, split towards 4 per SM, each split 4+ tiles; a pure decode grid (``decode``: one
    token per sequence) of fewer programs than SMs splits at least as many ways as one-tile splits of its first
    ``FEW_PROGRAMS_MAX_SEQ_LEN`` keys (rounded down to a power of two; a floor that only grows with the length, so
    the warm-up's walk over lengths holds): at batch 1 the chain of tiles per program sets the time (H200,
    batch-1 TPOT, one call: with the floor 3.6-7.1% faster than without wherever it changes the split count, e.g.
    1 x 256 keys bf16 4 vs 1 splits 1.477 vs 1.532 ms, k_int8_v_fp8 8 vs 2 1.504 vs 1.601).

    1-warp programs (H200 sweep, one-byte decode at 32 keys per tile, splits 1 / 4 / 16 measured): 512 programs ran
    fastest with 4 splits, 1,024 and more unsplit (GQA 7 at 256 x 512: 61 us vs 99 with 4 splits): no split from 6
    programs per SM, else 16 per SM rounded down to a power of two, each split 256+ keys; with fewer programs than SMs
    (batch 1 to ~16 past ``FEW_PROGRAMS_MAX_SEQ_LEN``) a split may be a single tile (then rounded down to a power of
    two, so one or two tiles): a batch of one gets 64 splits from 2,048 keys (fastest at 4K and 16K). No floor above
    one split: in ``bench throughput`` (k_int8_v_fp8 vs bf16, one call) floors of 1 / 2 / 4 ran 0.934x / 0.951x /
    0.904x, and 2 slowed the kernel sweep's uniform and 256-row mixed batches. Not measured: 256 programs get 8
    (4: 115 us, 16: 136 us at GQA 7, 64 x 4K)."""
    tiles = triton.cdiv(max_seq_len, block_n)
    if programs < 1:
        return 1
    if num_warps == 1:
        if programs >= 6 * sm_count:
            return 1
        # fewer programs than SMs: splits as short as one tile, before rounding down to a power of two (batch 1
        # ran fastest at 64 splits, 4K and 16K)
        min_keys = block_n if programs < sm_count else 256
        splits = min(16 * sm_count // programs, tiles * block_n // min_keys, 64)
        return _pow2_at_most(splits)
    floor = 1
    if decode and programs < sm_count:  # one-tile splits of the first FEW_PROGRAMS_MAX_SEQ_LEN keys: grows with length
        short_tiles = triton.cdiv(min(max_seq_len, FEW_PROGRAMS_MAX_SEQ_LEN), block_n)
        floor = _pow2_at_most(min(triton.cdiv(4 * sm_count, programs), short_tiles, 64))
    if programs >= 2 * sm_count or tiles < 8:
        return floor
    splits = min(triton.cdiv(4 * sm_count, programs), tiles // 4, 64)
    return max(floor, triton.next_power_of_2(splits) if splits > 1 else 1)


@dataclass(frozen=True)
class AttentionChoice:
    """What one batch selects. A compiled variant of the attention kernel is ``(config, fresh, cached,
    splits > 1)`` (everything else is fixed per engine: layout, head shape, dtype); the merge kernel's is the
    split count. The engine's warm-up compiles every choice reachable in serving (nanocore/runner/warmup_plan.py)."""

    config: AttentionConfig
    fresh: bool  # chunks of 2+ tokens read their own K/V from k_new / v_new
    cached: bool  # some position is read through the cache (False: first chunks of 2+ tokens only)
    splits: int  # KV splits (1: no split-KV, no merge kernel)


def reads_cache(fresh: bool, query_lens: list[int] | None, seq_lens: list[int] | None) -> bool:
    """False only for a batch of first chunks of 2+ tokens read fresh: no position comes from the cache."""
    return not fresh or query_lens is None or query_lens != seq_lens or min(query_lens) < 2


def batch_choice(max_query_len: int, max_seq_len: int, num_seqs: int, query_lens: list[int] | None,
                 seq_lens: list[int] | None, fresh: bool, group: int, num_kv_heads: int, head_dim: int,
                 kv_itemsize: int, k_grouped: bool, sm_count: int,
                 config: AttentionConfig | None = None) -> AttentionChoice:
    """The launch choices of one batch from host values only; ``sm_count`` 0 (CPU) never splits the KV range.

    Every per-batch constexpr of the attention kernels comes from here, so the warm-up can enumerate them.
    """
    cfg = config or default_config(max_query_len, group, head_dim, kv_itemsize, k_grouped=k_grouped,
                                   few_programs=num_seqs * num_kv_heads < sm_count, max_seq_len=max_seq_len)
    block_q = cfg.block_m // group
    if block_q < 1:
        raise ValueError(f"block_m {cfg.block_m} is smaller than the GQA group {group}")
    num_q_tiles = triton.cdiv(max(max_query_len, 1), block_q)
    cached = reads_cache(fresh, query_lens, seq_lens)
    splits = cfg.num_splits or 1
    if not cfg.num_splits and sm_count and (num_q_tiles == 1 or cached):
        # decode-shaped grids, and chunks over a cached prefix: a 128-token chunk at 32K context is 60 programs
        # of up to 32K keys each on Qwen2.5-7B (H200, eager: 6.5% MFU at a 15K prefix); first chunks never split
        q_tiles = num_seqs  # decode grids: one program per row, padded rows of a graph bucket included
        if num_q_tiles > 1:
            q_tiles = sum(-(-n // block_q) for n in query_lens) if query_lens else num_seqs * num_q_tiles
        splits = choose_num_splits(q_tiles * num_kv_heads, max_seq_len, cfg.block_n, sm_count, cfg.num_warps,
                                   decode=max_query_len <= 1)  # pure decode: chunks of a few tokens keep the rule
    return AttentionChoice(cfg, fresh, cached, splits)
