"""Triton paged attention kernels for mixed batches of prefill chunks and decodes (host side: ``paged_attention``).

One program handles ``BLOCK_Q`` query tokens of one sequence times the ``GROUP`` query heads that share
one KV head (GQA rows are packed into the M dimension, so every K/V tile is loaded once per group).
It walks the sequence's KV in ``BLOCK_N`` tiles through the block table, reading the codec's layout:
narrow K/V tiles are converted to q's dtype and their scales applied to the score / probability columns
(``quant_path`` "fold"; K scaled per group narrower than 16 is dequantized in registers before the dot), or, for
one-byte K and V, converted to fp16 and multiplied in fp16 ("fp16_hwcvt", ``narrow_attention``). Causal alignment is
lower-right: query ``i`` of a sequence with ``seq_len`` L and query length lq sits at position ``L - lq + i``.
With ``FRESH`` a chunk of 2+ tokens reads its own positions ``[L - lq, L)`` from ``k_new``/``v_new`` (the
step's K/V in the model dtype, no codec round trip) after the cached ones; a decode row reads its one new
token back from the cache (a separate tile for one key would cost every decode program a tile). A batch of
first chunks only (no cached position: ``CACHED`` False) compiles without the cache walk, so a fresh prompt's
prefill with a codec runs the same code as with a bf16 cache.
When few programs would cover long contexts, the KV range is split over a third grid axis and a reduction
kernel merges the partials (``split_kv``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from nanocore.kernels.narrow_attention import load_rows as _load_raw
from nanocore.kernels.narrow_attention import narrow_pv, narrow_scores
from nanocore.kernels.split_kv import _NEG_INIT, split_range, write_rows


@triton.jit
def _load_kv_tile(base_ptr, scale_ptr, slot, kvh, d, stride_t, stride_h, s_stride_t, s_stride_h, kv_ok,
                  OUT_DTYPE: tl.constexpr, SCALE: tl.constexpr, GROUP_SIZE: tl.constexpr,
                  MASKED: tl.constexpr, D_MASKED: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Load a ``[BLOCK_N, HEAD_DIM_PAD]`` K or V tile at cache rows ``slot``, dequantized per group of head_dim
    (``SCALE`` 2) or only converted (per-(token, head) scales are folded by the caller)."""
    ptrs = base_ptr + slot[:, None] * stride_t + kvh * stride_h + d[None, :]
    if MASKED or D_MASKED:
        mask = kv_ok[:, None] & (d[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    if SCALE == 2:  # one scale per group of head_dim
        sc_ptrs = scale_ptr + slot[:, None] * s_stride_t + kvh * s_stride_h + d[None, :] // GROUP_SIZE
        sc = tl.load(sc_ptrs, mask=kv_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
        x = (x.to(tl.float32) * sc.to(tl.float32)).to(OUT_DTYPE)
    else:
        x = x.to(OUT_DTYPE)
    return x


@triton.jit
def _row_scale(scale_ptr, slot, kvh, s_stride_t, s_stride_h, kv_ok, MASKED: tl.constexpr):
    """fp32 scale of each row ``slot`` (0 for rows past the sequence)."""
    ptrs = scale_ptr + slot * s_stride_t + kvh * s_stride_h
    if MASKED:
        sc = tl.load(ptrs, mask=kv_ok, other=0.0)
    else:
        sc = tl.load(ptrs)
    return sc.to(tl.float32)


@triton.jit
def _attend_tile(acc, m_i, l_i, q, q_ptr, q_off, row_ok, tile, kv_base, kv_stop, q_pos, seq, q_start, kvh, d,
                 k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
                 stride_kt, stride_kh, stride_vt, stride_vh,
                 ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
                 K_SCALE: tl.constexpr, V_SCALE: tl.constexpr,
                 K_GROUP: tl.constexpr, V_GROUP: tl.constexpr, MASKED: tl.constexpr,
                 HEAD_DIM: tl.constexpr, D_MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 K_SPLIT: tl.constexpr, NARROW: tl.constexpr, CVT: tl.constexpr,
                 K_INT8: tl.constexpr, V_INT8: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr,
                 KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr,
                 KS_NUM_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """One online-softmax step (fp32 statistics) over KV positions ``kv_base + tile*BLOCK_N ...`` below ``kv_stop``.

    Not ``PAGED``: K/V rows are ``q_start + position - kv_base`` of ``k_ptr``/``v_ptr`` (this step's own K/V).

    Per-(token, head) scales are applied outside the dots (K's to the score columns, V's to
    the probability columns), so the narrow tile is only converted. ``K_SPLIT``: a group-scaled K is
    read as ``HEAD_DIM / K_GROUP`` column slices, one dot each, scaled per score column and summed.
    ``NARROW``: one-byte K/V in fp16 (``narrow_attention``); ``q`` is then pre-scaled fp16.
    """
    k_pos = kv_base + tile * BLOCK_N + tl.arange(0, BLOCK_N)
    kv_ok = k_pos < kv_stop
    if PAGED:  # per-row lookup works for any page size, smaller or larger than BLOCK_N
        if MASKED:
            blk = tl.load(block_tables_ptr + seq * stride_bt + k_pos // PAGE_SIZE, mask=kv_ok, other=0)
        else:
            blk = tl.load(block_tables_ptr + seq * stride_bt + k_pos // PAGE_SIZE)
        slot = blk.to(tl.int64) * PAGE_SIZE + k_pos % PAGE_SIZE
    else:
        slot = (q_start + k_pos - kv_base).to(tl.int64)
    if NARROW:
        s = narrow_scores(q, q_ptr, q_off, row_ok, scale_log2, slot, kvh, d, kv_ok, k_ptr, ks_ptr, stride_kt,
                          stride_kh, BLOCK_M, BLOCK_N, K_SCALE, K_GROUP, K_INT8, K_UNIT, KS_ROW, KS_HALVES,
                          KS_NUM_PAD, MASKED, HEAD_DIM, D_MASKED, CVT, HEAD_DIM_PAD)
    elif K_SPLIT:  # S = sum_g (q[:, g] . K[:, g]^T) * ks[token, g]; the q slices are re-read (L1-resident)
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        e = tl.arange(0, K_GROUP)
        for g in tl.static_range(HEAD_DIM // K_GROUP):
            qg = tl.load(q_ptr + q_off[:, None] + (g * K_GROUP + e)[None, :], mask=row_ok[:, None], other=0.0)
            kg = _load_raw(k_ptr, slot, kvh, g * K_GROUP + e, stride_kt, stride_kh, kv_ok,
                           MASKED, False, HEAD_DIM).to(qg.dtype)
            ksg = _row_scale(ks_ptr + g, slot, kvh, ks_stride_t, ks_stride_h, kv_ok, MASKED)
            s += tl.dot(qg, tl.trans(kg), input_precision=DOT_PRECISION) * ksg[None, :]
        s = s * scale_log2
    elif K_SCALE == 1:
        k = _load_raw(k_ptr, slot, kvh, d, stride_kt, stride_kh, kv_ok, MASKED, D_MASKED, HEAD_DIM).to(q.dtype)
        ksc = _row_scale(ks_ptr, slot, kvh, ks_stride_t, ks_stride_h, kv_ok, MASKED) * scale_log2
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * ksc[None, :]
    else:
        k = _load_kv_tile(k_ptr, ks_ptr, slot, kvh, d, stride_kt, stride_kh, ks_stride_t, ks_stride_h, kv_ok,
                          q.dtype, K_SCALE, K_GROUP, MASKED, D_MASKED, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if MASKED:
        visible = (k_pos[None, :] <= q_pos[:, None]) & kv_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if NARROW:
        pv = narrow_pv(p, slot, kvh, d, kv_ok, v_ptr, vs_ptr, stride_vt, stride_vh, V_SCALE, V_INT8, V_UNIT,
                       VS_ROW, VS_HALVES, MASKED, HEAD_DIM, D_MASKED, CVT, HEAD_DIM_PAD)
    elif V_SCALE == 1:  # acc += (P * vs[token]) . V
        v = _load_raw(v_ptr, slot, kvh, d, stride_vt, stride_vh, kv_ok, MASKED, D_MASKED, HEAD_DIM).to(q.dtype)
        vsc = _row_scale(vs_ptr, slot, kvh, vs_stride_t, vs_stride_h, kv_ok, MASKED)
        pv = tl.dot((p * vsc[None, :]).to(q.dtype), v, input_precision=DOT_PRECISION)
    else:
        v = _load_kv_tile(v_ptr, vs_ptr, slot, kvh, d, stride_vt, stride_vh, vs_stride_t, vs_stride_h, kv_ok,
                          q.dtype, V_SCALE, V_GROUP, MASKED, D_MASKED, HEAD_DIM)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _attend_tiles(acc, m_i, l_i, q, q_ptr, q_off, row_ok, q_pos, seq, q_start, kvh, d, t_lo, t_full, t_hi,
                  kv_base, kv_stop, k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
                  stride_kt, stride_kh, stride_vt, stride_vh, ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
                  K_SCALE: tl.constexpr, V_SCALE: tl.constexpr, K_GROUP: tl.constexpr, V_GROUP: tl.constexpr,
                  HEAD_DIM: tl.constexpr, D_MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  K_SPLIT: tl.constexpr, NARROW: tl.constexpr, CVT: tl.constexpr,
                  K_INT8: tl.constexpr, V_INT8: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr,
                  KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr,
                  KS_NUM_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Tiles ``[t_lo, t_hi)`` of one KV source; those below ``t_full`` every row sees whole (no masks)."""
    for tile in range(t_lo, t_full):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_ptr, q_off, row_ok, tile, kv_base, kv_stop, q_pos, seq, q_start, kvh, d,
            k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
            BLOCK_M, BLOCK_N, PAGE_SIZE, PAGED, K_SCALE, V_SCALE, K_GROUP, V_GROUP, False, HEAD_DIM, D_MASKED,
            DOT_PRECISION, K_SPLIT, NARROW, CVT, K_INT8, V_INT8, K_UNIT, V_UNIT, KS_ROW, VS_ROW, KS_HALVES,
            VS_HALVES, KS_NUM_PAD, HEAD_DIM_PAD)
    for tile in range(t_full, t_hi):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_ptr, q_off, row_ok, tile, kv_base, kv_stop, q_pos, seq, q_start, kvh, d,
            k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
            BLOCK_M, BLOCK_N, PAGE_SIZE, PAGED, K_SCALE, V_SCALE, K_GROUP, V_GROUP, True, HEAD_DIM, D_MASKED,
            DOT_PRECISION, K_SPLIT, NARROW, CVT, K_INT8, V_INT8, K_UNIT, V_UNIT, KS_ROW, VS_ROW, KS_HALVES,
            VS_HALVES, KS_NUM_PAD, HEAD_DIM_PAD)
    return acc, m_i, l_i


@triton.jit
def _clamp(x, lo, hi):
    return tl.maximum(tl.minimum(x, hi), lo)


# per-batch integers (q tiles and KV splits per step, block-table width) are not specialised on: a new batch
# shape must not cost a compile mid-serving; only the constexprs pick a variant
@triton.jit(do_not_specialize=["num_q_tiles", "num_splits", "stride_bt"])
def paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, kn_ptr, vn_ptr, out_ptr, ws_acc_ptr, ws_ml_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr, order_ptr,
    scale_log2, new_scale_log2, num_q_tiles, num_splits, num_q_heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h, stride_knt, stride_knh, stride_vnt, stride_vnh,
    stride_ot, stride_oh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr, FRESH: tl.constexpr, CACHED: tl.constexpr, K_SCALE: tl.constexpr,
    V_SCALE: tl.constexpr, K_GROUP: tl.constexpr, V_GROUP: tl.constexpr, SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    K_SPLIT: tl.constexpr, NARROW: tl.constexpr, CVT: tl.constexpr,
    K_INT8: tl.constexpr, V_INT8: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr,
    KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr,
    KS_NUM_PAD: tl.constexpr, HEADS_FIRST: tl.constexpr, ORDERED: tl.constexpr,
):
    # HEADS_FIRST: the KV heads of one sequence are neighbouring programs, so the heads' rows of a cached token
    # (adjacent in the [slot, head, dim] cache) are read at about the same time
    pid = tl.program_id(1 if HEADS_FIRST else 0)
    kvh = tl.program_id(0 if HEADS_FIRST else 1)
    split = tl.program_id(2)
    if ORDERED:  # grids of one query tile per sequence: the i-th sequence launched is row order[i] (longest first)
        pid = tl.load(order_ptr + pid)
    seq = pid // num_q_tiles
    q_tile = num_q_tiles - 1 - pid % num_q_tiles  # heaviest causal tiles first: shorter tail
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    d = tl.arange(0, HEAD_DIM_PAD)
    D_MASKED: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    q_rows = (q_start + tok).to(tl.int64)
    q_off = q_rows * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    q_pos = ctx_len + tok
    if NARROW:  # fp16 dots: fold the softmax scale into q once
        q = (q.to(tl.float32) * scale_log2).to(tl.float16)

    first_pos = ctx_len + q_tile * BLOCK_Q  # position of the tile's first query
    kv_end = tl.minimum(seq_len, first_pos + BLOCK_Q)
    cache_end = kv_end  # positions [0, cache_end) through the cache, [cache_end, kv_end) from k_new / v_new
    if FRESH:
        cache_end = tl.where(q_len > 1, tl.maximum(ctx_len, 0), kv_end)
    cache_tiles = tl.cdiv(cache_end, BLOCK_N)
    num_tiles = cache_tiles + tl.cdiv(kv_end - cache_end, BLOCK_N)
    t_lo, t_hi = split_range(num_tiles, num_splits, split)

    m_i = tl.full([BLOCK_M], _NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    if CACHED:  # not CACHED: first chunks only (cache_end is 0), the codec's walk is not even compiled in
        lo, hi = tl.minimum(t_lo, cache_tiles), tl.minimum(t_hi, cache_tiles)
        full = _clamp(tl.minimum(cache_end, first_pos + 1) // BLOCK_N, lo, hi)
        acc, m_i, l_i = _attend_tiles(
            acc, m_i, l_i, q, q_ptr, q_off, row_ok, q_pos, seq, q_start, kvh, d, lo, full, hi, 0, cache_end,
            k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
            BLOCK_M, BLOCK_N, PAGE_SIZE, PAGED, K_SCALE, V_SCALE, K_GROUP, V_GROUP, HEAD_DIM, D_MASKED,
            DOT_PRECISION, K_SPLIT, NARROW, CVT, K_INT8, V_INT8, K_UNIT, V_UNIT, KS_ROW, VS_ROW, KS_HALVES,
            VS_HALVES, KS_NUM_PAD, HEAD_DIM_PAD)
    if FRESH:  # the chunk's own K/V in the model dtype: no scales, rows q_start + (position - cache_end)
        lo, hi = tl.maximum(t_lo - cache_tiles, 0), tl.maximum(t_hi - cache_tiles, 0)
        full = _clamp((tl.minimum(kv_end, first_pos + 1) - cache_end) // BLOCK_N, lo, hi)
        acc, m_i, l_i = _attend_tiles(
            acc, m_i, l_i, q, q_ptr, q_off, row_ok, q_pos, seq, q_start, kvh, d, lo, full, hi, cache_end, kv_end,
            kn_ptr, vn_ptr, kn_ptr, vn_ptr, block_tables_ptr, stride_bt, new_scale_log2,
            stride_knt, stride_knh, stride_vnt, stride_vnh, 0, 0, 0, 0,
            BLOCK_M, BLOCK_N, 1, False, 0, 0, 1, 1, HEAD_DIM, D_MASKED, DOT_PRECISION, False, False, 0,
            False, False, 1.0, 1.0, 0, 0, False, False, 1, HEAD_DIM_PAD)

    out_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    write_rows(acc, m_i, l_i, q_rows, head, d, row_ok, out_mask, out_ptr, ws_acc_ptr, ws_ml_ptr, num_q_heads,
               num_splits, split, stride_ot, stride_oh, HEAD_DIM_PAD, SPLIT)
