"""Split-KV (flash-decoding) pieces shared by the attention kernels: a split's tile range, a program's epilogue
(normalised rows, or a split's unnormalised partials) and the kernel that merges the partials."""
from __future__ import annotations

import triton
import triton.language as tl

#: Initial running max: finite, so a row that sees no key in a split never computes inf - inf.
_NEG_INIT = tl.constexpr(-1.0e30)


@triton.jit
def split_range(num_tiles, num_splits, split):
    """Tiles ``[t_lo, t_hi)`` of KV split ``split`` out of ``num_splits`` (the last splits may be empty)."""
    per_split = tl.cdiv(num_tiles, num_splits)
    t_lo = split * per_split
    return t_lo, tl.minimum(num_tiles, t_lo + per_split)


@triton.jit
def write_rows(acc, m_i, l_i, q_rows, head, d, row_ok, out_mask, out_ptr, ws_acc_ptr, ws_ml_ptr, num_q_heads,
               num_splits, split, stride_ot, stride_oh, HEAD_DIM_PAD: tl.constexpr, SPLIT: tl.constexpr):
    """Rows (token ``q_rows``, query ``head``) of a program's result: normalised into ``out``, or with ``SPLIT``
    the unnormalised partials (acc, running max and sum) that ``merge_splits_kernel`` combines."""
    if SPLIT:
        part = (q_rows * num_q_heads + head) * num_splits + split
        tl.store(ws_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], acc, mask=out_mask)
        tl.store(ws_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(ws_ml_ptr + part * 2 + 1, l_i, mask=row_ok)
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # a sequence with no keys yields zeros, not NaN
        out = acc / l_safe[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["num_splits"])  # SPLITS_PAD picks the variant, the count itself varies per step
def merge_splits_kernel(ws_acc_ptr, ws_ml_ptr, out_ptr, num_splits, stride_ot, stride_oh,
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
