"""Decode attention over one-byte (int8 / fp8 e4m3) K/V on CUDA cores: the "gqa" quantized path.

Why not the tensor-core tile (``narrow_attention``) for pure decode steps: an mma needs 16 rows, so a program of
one sequence and one KV head holds a 16 x head_dim fp32 accumulator of which only the GQA group's rows (2 for
Qwen3-0.6B) are real. ncu on the H200 (64 x 4K, GQA 2): 255 registers, 2 warps per scheduler, DRAM at 59%:
latency-bound. Here a program holds only ``GROUP_PAD`` (the group rounded up to a power of two) query rows; scores
and ``P . V`` are broadcast products reduced in fp32 registers, so every K/V byte is loaded and converted once
per group, and the small state leaves room for many warps per SM.

Per step: one program per (sequence, KV head, split). K/V bytes -> fp16 by bit tricks or the e4m3x2 instruction
(``narrow_convert``), then fp32. Scales: per-(token, head) K scales on the score columns, V scales on the
probability columns, group-scaled K on the converted tile; fp8's bit-trick unit folds into q and the output.
Split partials use ``paged_attention``'s workspace and ``split_kv``'s merge kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl

from nanocore.kernels.narrow_attention import head_scale, head_scales, load_rows
from nanocore.kernels.narrow_convert import narrow_to_f16
from nanocore.kernels.split_kv import _NEG_INIT, split_range, write_rows


@triton.jit
def _tile_bytes(tile, stop, seq, kvh, d, k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, stride_kt,
                stride_kh, stride_vt, stride_vh, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                HEAD_DIM: tl.constexpr, K_SCALE: tl.constexpr, V_SCALE: tl.constexpr, K_GROUP: tl.constexpr,
                KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr):
    """Issue the loads of keys ``tile * BLOCK_N ...`` below ``stop``: K / V bytes as stored and their scales
    (fp32; ones where the layout has none)."""
    k_pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    kv_ok = k_pos < stop
    blk = tl.load(block_tables_ptr + seq * stride_bt + k_pos // PAGE_SIZE, mask=kv_ok, other=0)
    slot = blk.to(tl.int64) * PAGE_SIZE + k_pos % PAGE_SIZE
    k = load_rows(k_ptr, slot, kvh, d, stride_kt, stride_kh, kv_ok, True, False, HEAD_DIM)
    v = load_rows(v_ptr, slot, kvh, d, stride_vt, stride_vh, kv_ok, True, False, HEAD_DIM)
    if K_SCALE == 2:
        NUM_G: tl.constexpr = HEAD_DIM // K_GROUP
        k_sc = head_scales(ks_ptr, slot, kvh, kv_ok, KS_ROW, NUM_G, NUM_G, KS_HALVES, True)  # [BLOCK_N, NUM_G]
    elif K_SCALE == 1:
        k_sc = head_scale(ks_ptr, slot, kvh, kv_ok, KS_ROW, KS_HALVES, True)
    else:
        k_sc = tl.full([BLOCK_N], 1.0, tl.float32)
    if V_SCALE == 1:
        v_sc = head_scale(vs_ptr, slot, kvh, kv_ok, VS_ROW, VS_HALVES, True)
    else:
        v_sc = tl.full([BLOCK_N], 1.0, tl.float32)
    return k, v, k_sc, v_sc, kv_ok


@triton.jit
def _attend(acc, m_i, l_i, q_ptr, q_base, stride_qh, q_scale, k, v, k_sc, v_sc, kv_ok, d,
            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
            K_SCALE: tl.constexpr, K_GROUP: tl.constexpr, K_INT8: tl.constexpr, V_INT8: tl.constexpr,
            CVT: tl.constexpr):
    """One online-softmax step over a loaded tile (keys outside ``kv_ok`` masked).

    Only 2-D tile ops, one query row at a time: the K / V tiles keep the layout of their 16-byte loads, so the
    score sums stay in a thread and 8 lanes, and ``P . V`` sums over the warp's rows (a 3-D broadcast product
    made Triton reduce across warps through shared memory and, without alignment hints, load byte by byte)."""
    k = narrow_to_f16(k, K_INT8, CVT).to(tl.float32)
    if K_SCALE == 2:  # group scales on the converted tile (per-token scales go on the scores)
        NUM_G: tl.constexpr = HEAD_DIM // K_GROUP
        k = tl.reshape(tl.reshape(k, [BLOCK_N, NUM_G, K_GROUP]) * k_sc[:, :, None], [BLOCK_N, HEAD_DIM])
    v = narrow_to_f16(v, V_INT8, CVT).to(tl.float32)
    rows = tl.arange(0, GROUP_PAD)
    for g in tl.static_range(GROUP):
        q = tl.load(q_ptr + q_base + g * stride_qh + d).to(tl.float32) * q_scale  # L1-resident re-read
        s = tl.sum(k * q[None, :], 1)  # [BLOCK_N] scores in log2 units
        if K_SCALE == 1:
            s = s * k_sc
        s = tl.where(kv_ok, s, float("-inf"))
        row = rows == g
        m_old = tl.max(tl.where(row, m_i, _NEG_INIT), 0)
        m_new = tl.maximum(m_old, tl.max(s, 0))
        alpha = tl.exp2(m_old - m_new)
        p = tl.exp2(s - m_new)
        l_i = tl.where(row, tl.sum(tl.where(row, l_i, 0.0), 0) * alpha + tl.sum(p, 0), l_i)
        m_i = tl.where(row, m_new, m_i)
        acc = tl.where(row[:, None], acc * alpha + tl.sum((p * v_sc)[:, None] * v, 0)[None, :], acc)
    return acc, m_i, l_i


# the split count and the block-table width vary per step: not specialised on (no compile mid-serving)
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def narrow_decode_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, ws_acc_ptr, ws_ml_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_tables_ptr, scale_log2, num_splits, num_q_heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, K_SCALE: tl.constexpr, V_SCALE: tl.constexpr, K_GROUP: tl.constexpr,
    K_INT8: tl.constexpr, V_INT8: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr,
    KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr,
    CVT: tl.constexpr, SPLIT: tl.constexpr, HEADS_FIRST: tl.constexpr,
):
    seq = tl.program_id(1 if HEADS_FIRST else 0)  # HEADS_FIRST: as in paged_attention_kernel
    kvh = tl.program_id(0 if HEADS_FIRST else 1)
    split = tl.program_id(2)
    q_row = tl.load(query_start_loc_ptr + seq)
    if tl.load(query_start_loc_ptr + seq + 1) == q_row:  # a padded sequence with no query this step
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    head = kvh * GROUP + g
    row_ok = g < GROUP
    d = tl.arange(0, HEAD_DIM)
    q_base = q_row.to(tl.int64) * stride_qt + kvh * GROUP * stride_qh
    q_scale = scale_log2 * K_UNIT  # fp8 bit-trick K comes out divided by K_UNIT

    t_lo, t_hi = split_range(tl.cdiv(seq_len, BLOCK_N), num_splits, split)
    m_i = tl.full([GROUP_PAD], _NEG_INIT, tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile in range(t_lo, t_hi):  # no prefetch of the next tile: measured slower (219 registers vs 128)
        k, v, k_sc, v_sc, kv_ok = _tile_bytes(
            tile, seq_len, seq, kvh, d, k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, stride_kt,
            stride_kh, stride_vt, stride_vh, BLOCK_N, PAGE_SIZE, HEAD_DIM, K_SCALE, V_SCALE, K_GROUP, KS_ROW,
            VS_ROW, KS_HALVES, VS_HALVES)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q_ptr, q_base, stride_qh, q_scale, k, v, k_sc, v_sc, kv_ok, d,
                                GROUP, GROUP_PAD, BLOCK_N, HEAD_DIM, K_SCALE, K_GROUP, K_INT8, V_INT8, CVT)
    q_rows = tl.full([GROUP_PAD], 0, tl.int64) + q_row  # every row of the group is the sequence's one token
    write_rows(acc * V_UNIT, m_i, l_i, q_rows, head, d, row_ok, row_ok[:, None], out_ptr, ws_acc_ptr, ws_ml_ptr,
               num_q_heads, num_splits, split, stride_ot, stride_oh, HEAD_DIM, SPLIT)


def narrow_decode(q, k, v, ks, vs, meta, scale_log2: float, narrow: dict, codes: tuple[int, int], k_group: int,
                  page: int, block_n: int, num_warps: int, splits: int,
                  ws_acc, ws_ml, out, heads_first: bool = False) -> None:
    """Launch ``narrow_decode_kernel`` for a pure decode step (one query per sequence) into ``out`` (or, ``splits``
    > 1, its partials into ``ws_acc`` / ``ws_ml`` for the merge kernel); ``k`` / ``v`` ``[num_slots, Hkv, D]``
    one-byte, ``ks`` / ``vs`` as the fp16 path reads them (``HALVES``: int32 words)."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k.shape[1]
    block_tables = meta.block_tables
    grid = (k.shape[1], meta.seq_lens.shape[0], splits) if heads_first else (meta.seq_lens.shape[0], k.shape[1], splits)
    narrow_decode_kernel[grid](
        q, k, v, ks, vs, out, ws_acc, ws_ml, meta.query_start_loc, meta.seq_lens, block_tables,
        scale_log2, splits, num_q_heads, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), HEAD_DIM=head_dim, BLOCK_N=block_n, PAGE_SIZE=page,
        K_SCALE=codes[0], V_SCALE=codes[1], K_GROUP=k_group, K_INT8=narrow["K_INT8"], V_INT8=narrow["V_INT8"],
        K_UNIT=narrow["K_UNIT"], V_UNIT=narrow["V_UNIT"], KS_ROW=narrow["KS_ROW"], VS_ROW=narrow["VS_ROW"],
        KS_HALVES=narrow["KS_HALVES"], VS_HALVES=narrow["VS_HALVES"], CVT=narrow["CVT"], SPLIT=splits > 1,
        HEADS_FIRST=heads_first, num_warps=num_warps, num_stages=1)


def covers(narrow: dict, head_dim: int, codes: tuple[int, int], k_group: int, max_query_len: int) -> bool:
    """Whether ``narrow_decode_kernel`` reads this step: one-byte K and V on the fp16 path, one query per
    sequence, head_dim and K's scale groups powers of two."""
    pow2 = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
    return (narrow["NARROW"] and narrow["WORDS"] == 0 and max_query_len <= 1 and pow2(head_dim)
            and (codes[0] != 2 or pow2(head_dim // k_group)))
