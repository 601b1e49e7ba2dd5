"""Triton paged attention for mixed batches of prefill chunks and decodes, with its torch twin.

One program handles ``BLOCK_Q`` query tokens of one sequence times the ``GROUP`` query heads that share
one KV head (GQA rows are packed into the M dimension, so every K/V tile is loaded once per group).
It walks the sequence's KV in ``BLOCK_N`` tiles through the block table, reading the codec's layout:
narrow K/V tiles are converted to q's dtype and their scales applied to the score / probability columns
(``quant_path`` "fold"), scaled in registers before the dots ("dequant"), or, for one-byte K and V, converted
to fp16 with integer bit tricks and multiplied in fp16 ("fp16*", ``narrow_attention``). Causal alignment is
lower-right: query ``i`` of a sequence with ``seq_len`` L and query length lq sits at position ``L - lq + i``.
When few programs would cover long contexts, the KV range is split over a third grid axis and a reduction
kernel merges the partials.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanocore.interfaces import KVCache, KVLayout
from nanocore.kernels.attention_config import (DEFAULT_QUANT_PATH, GROUP_K_DECODE_TILE, NARROW_DECODE_TILE,  # noqa: F401
                                              QUANT_PATHS, AttentionConfig, choose_num_splits, default_config,
                                              default_quant_path)
from nanocore.kernels.device import sm_count
from nanocore.kernels.narrow_attention import load_rows as _load_raw
from nanocore.kernels.narrow_attention import narrow_constexprs, narrow_pv, narrow_scores

#: Scale granularity -> constexpr code used by the kernels.
SCALE_CODES = {"none": 0, "token_head": 1, "group": 2}
#: Initial running max: finite, so a row that sees no key in a split never computes inf - inf.
_NEG_INIT = tl.constexpr(-1.0e30)
LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(base_ptr, scale_ptr, slot, kvh, d, stride_t, stride_h, s_stride_t, s_stride_h, kv_ok,
                  OUT_DTYPE: tl.constexpr, SCALE: tl.constexpr, GROUP_SIZE: tl.constexpr,
                  MASKED: tl.constexpr, D_MASKED: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Load a ``[BLOCK_N, HEAD_DIM_PAD]`` K or V tile at cache rows ``slot`` and dequantize it."""
    ptrs = base_ptr + slot[:, None] * stride_t + kvh * stride_h + d[None, :]
    if MASKED or D_MASKED:
        mask = kv_ok[:, None] & (d[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    if SCALE == 1:  # one scale per (token, head)
        sc = tl.load(scale_ptr + slot * s_stride_t + kvh * s_stride_h, mask=kv_ok, other=0.0)
        x = (x.to(tl.float32) * sc.to(tl.float32)[:, None]).to(OUT_DTYPE)
    elif SCALE == 2:  # one scale per group of head_dim
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
def _attend_tile(acc, m_i, l_i, q, q_ptr, q_off, row_ok, tile, q_pos, seq, q_start, seq_len, kvh, d,
                 k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
                 stride_kt, stride_kh, stride_vt, stride_vh,
                 ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
                 K_SCALE: tl.constexpr, V_SCALE: tl.constexpr,
                 K_GROUP: tl.constexpr, V_GROUP: tl.constexpr, MASKED: tl.constexpr,
                 HEAD_DIM: tl.constexpr, D_MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 FOLD: tl.constexpr, K_SPLIT: tl.constexpr, NARROW: tl.constexpr, CVT: tl.constexpr,
                 K_INT8: tl.constexpr, V_INT8: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr,
                 KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr,
                 KS_NUM_PAD: tl.constexpr, WORDS: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """One online-softmax step (fp32 statistics) over KV positions ``tile*BLOCK_N ...``.

    ``FOLD``: per-(token, head) scales are applied outside the dots (K's to the score columns, V's to
    the probability columns), so the narrow tile is only converted. ``K_SPLIT``: a group-scaled K is
    read as ``HEAD_DIM / K_GROUP`` column slices, one dot each, scaled per score column and summed.
    ``NARROW``: one-byte K/V in fp16 (``narrow_attention``); ``q`` is then pre-scaled fp16.
    """
    k_pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    kv_ok = k_pos < seq_len
    if PAGED:  # per-row lookup works for any page size, smaller or larger than BLOCK_N
        if MASKED:
            blk = tl.load(block_tables_ptr + seq * stride_bt + k_pos // PAGE_SIZE, mask=kv_ok, other=0)
        else:
            blk = tl.load(block_tables_ptr + seq * stride_bt + k_pos // PAGE_SIZE)
        slot = blk.to(tl.int64) * PAGE_SIZE + k_pos % PAGE_SIZE
    else:
        slot = (q_start + k_pos).to(tl.int64)
    if NARROW:
        s = narrow_scores(q, q_ptr, q_off, row_ok, scale_log2, slot, kvh, d, kv_ok, k_ptr, ks_ptr, stride_kt,
                          stride_kh, BLOCK_M, BLOCK_N, K_SCALE, K_GROUP, K_INT8, K_UNIT, KS_ROW, KS_HALVES,
                          KS_NUM_PAD, MASKED, HEAD_DIM, D_MASKED, CVT, WORDS, HEAD_DIM_PAD)
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
    elif FOLD and K_SCALE == 1:
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
                       VS_ROW, VS_HALVES, MASKED, HEAD_DIM, D_MASKED, CVT, WORDS, BLOCK_N, HEAD_DIM_PAD)
    elif FOLD and V_SCALE == 1:  # acc += (P * vs[token]) . V
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
def paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, ws_acc_ptr, ws_ml_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    scale_log2, num_q_tiles, num_splits, num_q_heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h, stride_ot, stride_oh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr, K_SCALE: tl.constexpr, V_SCALE: tl.constexpr,
    K_GROUP: tl.constexpr, V_GROUP: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FOLD: tl.constexpr, K_SPLIT: tl.constexpr, NARROW: tl.constexpr, CVT: tl.constexpr,
    K_INT8: tl.constexpr, V_INT8: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr,
    KS_ROW: tl.constexpr, VS_ROW: tl.constexpr, KS_HALVES: tl.constexpr, VS_HALVES: tl.constexpr,
    KS_NUM_PAD: tl.constexpr, WORDS: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
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
    num_tiles = tl.cdiv(kv_end, BLOCK_N)
    full_tiles = tl.minimum(kv_end, first_pos + 1) // BLOCK_N  # tiles every row sees entirely
    per_split = tl.cdiv(num_tiles, num_splits)
    t_lo = split * per_split
    t_hi = tl.minimum(num_tiles, t_lo + per_split)
    t_full = tl.maximum(tl.minimum(full_tiles, t_hi), t_lo)

    m_i = tl.full([BLOCK_M], _NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    for tile in range(t_lo, t_full):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_ptr, q_off, row_ok, tile, q_pos, seq, q_start, seq_len, kvh, d,
            k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
            BLOCK_M, BLOCK_N, PAGE_SIZE, PAGED,
            K_SCALE, V_SCALE, K_GROUP, V_GROUP, False, HEAD_DIM, D_MASKED, DOT_PRECISION, FOLD, K_SPLIT,
            NARROW, CVT, K_INT8, V_INT8, K_UNIT, V_UNIT, KS_ROW, VS_ROW, KS_HALVES, VS_HALVES, KS_NUM_PAD,
            WORDS, HEAD_DIM_PAD)
    for tile in range(t_full, t_hi):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_ptr, q_off, row_ok, tile, q_pos, seq, q_start, seq_len, kvh, d,
            k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, stride_bt, scale_log2,
            stride_kt, stride_kh, stride_vt, stride_vh, ks_stride_t, ks_stride_h, vs_stride_t, vs_stride_h,
            BLOCK_M, BLOCK_N, PAGE_SIZE, PAGED,
            K_SCALE, V_SCALE, K_GROUP, V_GROUP, True, HEAD_DIM, D_MASKED, DOT_PRECISION, FOLD, K_SPLIT,
            NARROW, CVT, K_INT8, V_INT8, K_UNIT, V_UNIT, KS_ROW, VS_ROW, KS_HALVES, VS_HALVES, KS_NUM_PAD,
            WORDS, HEAD_DIM_PAD)

    out_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    if SPLIT:  # partials: unnormalised acc, running max and sum, merged by _merge_splits_kernel
        part = (q_rows * num_q_heads + head) * num_splits + split
        tl.store(ws_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], acc, mask=out_mask)
        tl.store(ws_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(ws_ml_ptr + part * 2 + 1, l_i, mask=row_ok)
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # a sequence with no keys yields zeros, not NaN
        out = acc / l_safe[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _merge_splits_kernel(ws_acc_ptr, ws_ml_ptr, out_ptr, num_splits, stride_ot, stride_oh,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    part = (tok * num_heads + head) * num_splits + s
    s_ok = s < num_splits
    m = tl.load(ws_ml_ptr + part * 2, mask=s_ok, other=_NEG_INIT)
    l = tl.load(ws_ml_ptr + part * 2 + 1, mask=s_ok, other=0.0)
    acc = tl.load(ws_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], mask=s_ok[:, None], other=0.0)
    w = tl.exp2(m - tl.max(m, 0))
    total = tl.sum(w * l, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


def _layout_args(cache: KVCache | None, layout: KVLayout | None, k_new, v_new):
    """(k, v, k_scale, v_scale, scale codes, group sizes, strides, page size) the kernel reads."""
    if cache is None:
        k, v, ks, vs, page = k_new, v_new, None, None, 1
        codes, groups = (0, 0), (1, 1)
    else:
        k, v, ks, vs, page = cache.k, cache.v, cache.k_scale, cache.v_scale, cache.block_size
        k_mode, v_mode = (layout.k_scale, layout.v_scale) if layout is not None else ("none", "none")
        codes = (SCALE_CODES[k_mode], SCALE_CODES[v_mode])
        groups = tuple(max(layout.group_size, 1) if layout is not None else 1 for _ in range(2))
        k = k.view(-1, *k.shape[2:])  # [num_slots, Hkv, D]
        v = v.view(-1, *v.shape[2:])
    for x in (k, v):
        if x.stride(-1) != 1:
            raise ValueError("paged_attention needs head_dim contiguous K/V tensors")
    ks = ks.view(-1, *ks.shape[2:]) if ks is not None else k
    vs = vs.view(-1, *vs.shape[2:]) if vs is not None else v
    return k, v, ks, vs, codes, groups, page


def _quant_flags(path: str, codes: tuple[int, int], k_group: int) -> tuple[bool, bool]:
    """(FOLD, K_SPLIT) constexprs for ``path``; both False when no scale is folded."""
    if path not in QUANT_PATHS:
        raise ValueError(f"quant_path {path!r} is not one of {QUANT_PATHS}")
    fold = path != "dequant" and 1 in codes
    k_split = path == "fold" and codes[0] == 2 and k_group >= 16 and k_group & (k_group - 1) == 0
    return fold, k_split


def paged_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cache: KVCache | None,
                    meta, scale: float, layout: KVLayout | None = None,
                    config: AttentionConfig | None = None) -> torch.Tensor:
    """Triton twin of ``paged_attention_reference``: ``q [T, Hq, D]`` -> ``[T, Hq, D]``.

    Reads the paged ``cache`` through ``meta.block_tables`` (or ``k_new``/``v_new`` when ``cache`` is
    None). Grid and split count come from ``meta.max_query_len`` / ``meta.max_seq_len``: no host sync.
    Rows of tokens past ``query_start_loc[-1]`` are left unwritten, as in the reference.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    k, v, ks, vs, codes, groups, page = _layout_args(cache, layout, k_new, v_new)
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    kv_itemsize = max(k.element_size(), v.element_size())
    path = (config.quant_path if config is not None else None) or default_quant_path()
    cfg = config or default_config(meta.max_query_len, group, head_dim, kv_itemsize,
                                   k_grouped=codes[0] == SCALE_CODES["group"], quant_path=path)
    narrow = narrow_constexprs(path, q, k, v, ks, vs, codes, groups[0], head_dim)
    v_arg = v.view(torch.int32) if narrow["WORDS"] else v  # strides below are then in words
    k = k.view(torch.int32) if narrow["WORDS"] == 2 else k
    scale_strides = (ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1))
    ks = ks.reshape(-1).view(torch.int32) if narrow["KS_HALVES"] else ks
    vs = vs.reshape(-1).view(torch.int32) if narrow["VS_HALVES"] else vs
    fold, k_split = _quant_flags("fold" if path.startswith("fp16") else path, codes, groups[0])
    block_q = cfg.block_m // group
    if block_q < 1:
        raise ValueError(f"block_m {cfg.block_m} is smaller than the GQA group {group}")
    num_seqs = meta.seq_lens.shape[0]
    num_q_tiles = triton.cdiv(max(meta.max_query_len, 1), block_q)
    programs = num_seqs * num_q_tiles * num_kv_heads
    splits = cfg.num_splits
    if splits == 0:
        splits = choose_num_splits(programs, meta.max_seq_len, cfg.block_n, sm_count(q.device)) \
            if q.is_cuda and num_q_tiles == 1 else 1
    head_dim_pad = triton.next_power_of_2(head_dim)
    out = torch.empty(num_tokens, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    if splits > 1:
        ws_acc = torch.empty(num_tokens * num_q_heads * splits, head_dim_pad, dtype=torch.float32, device=q.device)
        ws_ml = torch.empty(num_tokens * num_q_heads * splits, 2, dtype=torch.float32, device=q.device)
    else:
        ws_acc = ws_ml = out
    block_tables = meta.block_tables if cache is not None else meta.seq_lens
    stride_bt = block_tables.stride(0) if block_tables.dim() == 2 else 0
    grid = (num_seqs * num_q_tiles, num_kv_heads, splits)
    paged_attention_kernel[grid](
        q, k, v_arg, ks, vs, out, ws_acc, ws_ml, meta.query_start_loc, meta.seq_lens, block_tables,
        scale * LOG2E, num_q_tiles, splits, num_q_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v_arg.stride(0), v_arg.stride(1),
        *scale_strides, out.stride(0), out.stride(1), stride_bt,
        GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.block_m, BLOCK_Q=block_q,
        BLOCK_N=cfg.block_n, PAGE_SIZE=page, PAGED=cache is not None, K_SCALE=codes[0], V_SCALE=codes[1],
        K_GROUP=groups[0], V_GROUP=groups[1], SPLIT=splits > 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FOLD=fold, K_SPLIT=k_split, **narrow,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            ws_acc, ws_ml, out, splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, SPLITS_PAD=triton.next_power_of_2(splits),
            num_warps=4)
    return out
