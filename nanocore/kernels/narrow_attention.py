"""Paged attention over one-byte (int8 / fp8 e4m3) K/V caches in fp16: the "fp16_hwcvt" quantized path.

Why (sm_90 SASS of the bf16 "fold" path, Triton 3.6): e4m3 becomes bf16 through one F2F per element
(e4m3 -> f16 -> bf16), V is read byte by byte from shared memory (8-bit operands cannot use the transposing
ldmatrix), 2-byte scale loads are not pipelined, and the kernel holds 186-255 registers (2 programs per SM).
Here every int8 and e4m3 value is exact in fp16, so a one-byte tile becomes fp16 in registers (``CVT``, see
``narrow_convert``); fp16 scales are read as int32 words. The query is pre-scaled by ``softmax scale *
log2(e)`` and rounded to fp16 once; both dots accumulate in fp32. Per-(token, head) scales are folded into the
score columns (K) and into the probability columns (V); the latter are divided by the tile's largest V scale
first, so the fp16 probabilities stay in [0, 1] whatever the scales' range.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanocore.kernels.attention_config import fp16_path
from nanocore.kernels.device import converts_fp8, interpreting
from nanocore.kernels.narrow_convert import FP8_BITS_UNIT, narrow_to_f16


@triton.jit
def load_rows(base_ptr, slot, kvh, cols, stride_t, stride_h, kv_ok,
              MASKED: tl.constexpr, COL_MASKED: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Cache rows ``slot`` at columns ``cols`` as stored (no scale); both attention paths load through it."""
    ptrs = base_ptr + slot[:, None] * stride_t + kvh * stride_h + cols[None, :]
    if MASKED or COL_MASKED:
        x = tl.load(ptrs, mask=kv_ok[:, None] & (cols[None, :] < HEAD_DIM), other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _halves(w, HI):
    """fp32 of the fp16 in the low (``HI`` 0) or high half of int32 words ``w``."""
    return ((w >> (16 * HI)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _load_vec(ptrs, ok, MASKED: tl.constexpr):
    if MASKED:
        x = tl.load(ptrs, mask=ok, other=0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def head_scales(scale_ptr, slot, kvh, kv_ok, ROW: tl.constexpr, NUM: tl.constexpr, NUM_PAD: tl.constexpr,
                HALVES: tl.constexpr, MASKED: tl.constexpr):
    """``[BLOCK_N, NUM_PAD]`` fp32 scales of head ``kvh`` at rows ``slot`` (``ROW`` elements per slot, the head's
    ``NUM`` scales contiguous). ``HALVES``: fp16 scales read through ``scale_ptr`` as int32 words (``ROW`` in
    words), so the loads are wide enough for the pipeliner's asynchronous copies (2-byte loads are not)."""
    if HALVES:
        c = tl.arange(0, NUM_PAD // 2)
        ok = kv_ok[:, None] & (c[None, :] < NUM // 2)
        w = _load_vec(scale_ptr + slot[:, None] * ROW + kvh * (NUM // 2) + c[None, :], ok, MASKED)
        sc = tl.reshape(tl.join(_halves(w, 0), _halves(w, 1)), [w.shape[0], NUM_PAD])
    else:
        c = tl.arange(0, NUM_PAD)
        ok = kv_ok[:, None] & (c[None, :] < NUM)
        sc = _load_vec(scale_ptr + slot[:, None] * ROW + kvh * NUM + c[None, :], ok, MASKED or NUM != NUM_PAD)
        sc = sc.to(tl.float32)
    return sc


@triton.jit
def head_scale(scale_ptr, slot, kvh, kv_ok, ROW: tl.constexpr, HALVES: tl.constexpr, MASKED: tl.constexpr):
    """``[BLOCK_N]`` fp32 per-(token, head) scale; ``HALVES``: fp16 scales read as int32 words holding the
    scales of heads ``2i, 2i + 1`` (``ROW`` in words)."""
    if HALVES:
        sc = _halves(_load_vec(scale_ptr + slot * ROW + kvh // 2, kv_ok, MASKED), kvh % 2)
    else:
        sc = _load_vec(scale_ptr + slot * ROW + kvh, kv_ok, MASKED).to(tl.float32)
    return sc


@triton.jit
def narrow_scores(q16, q_ptr, q_off, row_ok, scale_log2, slot, kvh, d, kv_ok, k_ptr, ks_ptr, stride_kt, stride_kh,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_SCALE: tl.constexpr, K_GROUP: tl.constexpr,
                  K_INT8: tl.constexpr, K_UNIT: tl.constexpr, KS_ROW: tl.constexpr, KS_HALVES: tl.constexpr,
                  KS_NUM_PAD: tl.constexpr, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr,
                  D_MASKED: tl.constexpr, CVT: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Scores in log2 units ``[BLOCK_M, BLOCK_N]`` (fp32) of the fp16 queries against a one-byte K tile."""
    if K_SCALE == 2:  # group scales: one dot per group of head_dim, scaled per score column
        NUM_G: tl.constexpr = HEAD_DIM // K_GROUP
        ks = head_scales(ks_ptr, slot, kvh, kv_ok, KS_ROW, NUM_G, KS_NUM_PAD, KS_HALVES, MASKED) * K_UNIT
        gcol = tl.arange(0, KS_NUM_PAD)
        e = tl.arange(0, K_GROUP)
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for g in tl.static_range(NUM_G):
            qg = tl.load(q_ptr + q_off[:, None] + (g * K_GROUP + e)[None, :], mask=row_ok[:, None], other=0.0)
            qg = (qg.to(tl.float32) * scale_log2).to(tl.float16)  # L1-resident re-read, cheaper than registers
            kg = narrow_to_f16(load_rows(k_ptr, slot, kvh, g * K_GROUP + e, stride_kt, stride_kh, kv_ok,
                                          MASKED, False, HEAD_DIM), K_INT8, CVT)
            ksg = tl.sum(tl.where(gcol[None, :] == g, ks, 0.0), 1)
            s += tl.dot(qg, tl.trans(kg)) * ksg[None, :]
    else:
        k = narrow_to_f16(load_rows(k_ptr, slot, kvh, d, stride_kt, stride_kh, kv_ok, MASKED, D_MASKED,
                                     HEAD_DIM), K_INT8, CVT)
        s = tl.dot(q16, tl.trans(k))
        if K_SCALE == 1:
            s = s * (head_scale(ks_ptr, slot, kvh, kv_ok, KS_ROW, KS_HALVES, MASKED) * K_UNIT)[None, :]
        elif K_UNIT != 1.0:
            s = s * K_UNIT
    return s


@triton.jit
def narrow_pv(p, slot, kvh, d, kv_ok, v_ptr, vs_ptr, stride_vt, stride_vh,
              V_SCALE: tl.constexpr, V_INT8: tl.constexpr, V_UNIT: tl.constexpr, VS_ROW: tl.constexpr,
              VS_HALVES: tl.constexpr, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, D_MASKED: tl.constexpr,
              CVT: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """``P . V`` (fp32 ``[BLOCK_M, HEAD_DIM_PAD]``) for fp32 probabilities ``p`` and a one-byte V tile."""
    v = narrow_to_f16(load_rows(v_ptr, slot, kvh, d, stride_vt, stride_vh, kv_ok, MASKED, D_MASKED, HEAD_DIM),
                      V_INT8, CVT)
    if V_SCALE == 1:  # columns of P times vs / max(vs): fp16 operands in [0, 1]; the max goes on the result
        vs = head_scale(vs_ptr, slot, kvh, kv_ok, VS_ROW, VS_HALVES, MASKED)
        top = tl.max(vs, 0)
        top = tl.where(top > 0, top, 1.0)
        pv = tl.dot((p * (vs * (1.0 / top))[None, :]).to(tl.float16), v) * (top * V_UNIT)
    else:
        pv = tl.dot(p.to(tl.float16), v)
        if V_UNIT != 1.0:
            pv = pv * V_UNIT
    return pv


_NARROW_DTYPES = (torch.int8, torch.float8_e4m3fn)


def narrow_constexprs(path: str, q: torch.Tensor, k, v, ks, vs, codes: tuple[int, int], k_group: int,
                 head_dim: int) -> dict:
    """Constexprs of the fp16 path for ``paged_attention_kernel`` (``NARROW`` False where ``path`` or the
    layout does not allow it: then the kernel takes the "fold" path). ``paged_attention`` memoises the result per step
    under a key of what this reads (dtypes, scale codes and strides, group, shapes): a new input belongs in that key."""
    off = dict(NARROW=False, CVT=0, K_INT8=False, V_INT8=False, K_UNIT=1.0, V_UNIT=1.0, KS_ROW=0, VS_ROW=0,
               KS_HALVES=False, VS_HALVES=False, KS_NUM_PAD=1)
    k_groups = head_dim // k_group if codes[0] == 2 else 1
    ok = (fp16_path(path) and q.dtype in (torch.float16, torch.bfloat16)
          and k.dtype in _NARROW_DTYPES and v.dtype in _NARROW_DTYPES and codes[1] in (0, 1)
          and (codes[0] in (0, 1) or (k_group >= 16 and k_group & (k_group - 1) == 0 and head_dim % k_group == 0)))
    # scales are read as contiguous rows of [slot, head, group]
    for code, sc, groups in ((codes[0], ks, k_groups), (codes[1], vs, 1)):
        ok = ok and (code == 0 or (sc.stride(-1) == 1 and sc.stride(1) == groups
                                   and sc.stride(0) == sc.shape[1] * groups))
    if not ok:
        return off
    interpret = interpreting(q.device)
    cvt = 0 if interpret else (2 if converts_fp8(q.device) else 1)
    unit = {torch.int8: 1.0, torch.float8_e4m3fn: FP8_BITS_UNIT if cvt == 1 else 1.0}
    # 2-byte scales travel as int32 words (pairs of heads, or pairs of groups of one head)
    k_halves = (codes[0] != 0 and ks.element_size() == 2 and ks.stride(0) % 2 == 0
                and (codes[0] == 1 or k_groups % 2 == 0))
    v_halves = codes[1] != 0 and vs.element_size() == 2 and vs.stride(0) % 2 == 0
    ks_row = (ks.stride(0) // 2 if k_halves else ks.stride(0)) if codes[0] else 0
    vs_row = (vs.stride(0) // 2 if v_halves else vs.stride(0)) if codes[1] else 0
    return dict(NARROW=True, CVT=cvt, K_INT8=k.dtype == torch.int8, V_INT8=v.dtype == torch.int8,
                K_UNIT=unit[k.dtype], V_UNIT=unit[v.dtype], KS_ROW=ks_row, VS_ROW=vs_row,
                KS_HALVES=k_halves, VS_HALVES=v_halves,
                KS_NUM_PAD=triton.next_power_of_2(k_groups))
