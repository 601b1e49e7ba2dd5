"""Fused RMSNorm over the last dim, with the optional residual add: ``out = norm(x + residual) * w``.

Rows are a ``[A, B, hidden]`` view (2-D input: B = 1) so the per-head q/k norm reads its strided slice of
the qkv output without a copy. The numbers follow ``rms_norm_reference`` in nanocore/layers/norm.py:
the sum ``x + residual`` is rounded to its dtype (and written as the new residual), statistics are fp32,
the normed row is rounded to the input dtype before the weight multiply, which rounds once to the output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TILE = 8192  # longest row held in registers; longer rows loop over chunks in two passes
LOOP_BLOCK = 4096


@triton.jit(do_not_specialize=["num_rows"])  # rows = tokens of the step: no compile per batch size
def _rms_norm_tile_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr,
    num_rows, B, x_stride_a, x_stride_b, r_stride_a, r_stride_b, N, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``BLOCK_R`` whole rows per program (several short rows, e.g. heads, share one program)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    ok = (rows < num_rows)[:, None] & (cols < N)[None, :]
    a, b = rows // B, rows % B
    x = tl.load(x_ptr + (a * x_stride_a + b * x_stride_b)[:, None] + cols[None, :], mask=ok, other=0.0)
    out_offs = rows[:, None] * N + cols[None, :]  # outputs are contiguous [num_rows, N]
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + (a * r_stride_a + b * r_stride_b)[:, None] + cols[None, :], mask=ok, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)  # torch rounds x + residual
        tl.store(res_out_ptr + out_offs, s, mask=ok)
        xf = s.to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, 1) / N + eps)
        normed = (xf * inv[:, None]).to(res_out_ptr.dtype.element_ty).to(tl.float32)
    else:
        xf = x.to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, 1) / N + eps)
        normed = (xf * inv[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + out_offs, (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rms_norm_loop_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr,
    B, x_stride_a, x_stride_b, r_stride_a, r_stride_b, N, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One long row per program: pass 1 sums squares (and writes the residual), pass 2 normalizes."""
    row = tl.program_id(0).to(tl.int64)
    a, b = row // B, row % B
    x_row = x_ptr + a * x_stride_a + b * x_stride_b
    r_row = r_ptr + a * r_stride_a + b * r_stride_b
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < N
        xf = tl.load(x_row + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            s = (xf + tl.load(r_row + cols, mask=ok, other=0.0).to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * N + cols, s, mask=ok)
            xf = s.to(tl.float32)
        acc += xf * xf
    inv = tl.rsqrt(tl.sum(acc, 0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < N
        if HAS_RESIDUAL:  # pass 2 re-reads the rounded sum it wrote
            v = tl.load(res_out_ptr + row * N + cols, mask=ok, other=0.0)
            normed = (v.to(tl.float32) * inv).to(res_out_ptr.dtype.element_ty).to(tl.float32)
        else:
            v = tl.load(x_row + cols, mask=ok, other=0.0)
            normed = (v.to(tl.float32) * inv).to(x_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * N + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """A ``[A, B, N]`` view of ``x`` with unit stride along N (copies only when no such view exists)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() == 3:
        return x
    try:
        return x.view(-1, x.shape[-2], x.shape[-1])
    except RuntimeError:
        return x.reshape(-1, x.shape[-2], x.shape[-1])


def tile_rows(num_rows: int, block_n: int) -> tuple[int, int]:
    """(rows per program, warps): ~1k elements per program; changes with ``num_rows`` only at powers of two."""
    block_r = min(max(1024 // block_n, 1), triton.next_power_of_2(num_rows))
    return block_r, min(max(block_r * block_n // 256, 1), 8)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Same result as ``rms_norm_reference``: ``norm(x)`` or ``(norm(x + residual), x + residual)``."""
    n = x.shape[-1]
    in_dtype = torch.promote_types(x.dtype, residual.dtype) if residual is not None else x.dtype
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, in_dtype), device=x.device)
    res_out = torch.empty(x.shape, dtype=in_dtype, device=x.device) if residual is not None else out
    xv = as_rows(x)
    rv = as_rows(residual) if residual is not None else xv
    num_rows, b = xv.shape[0] * xv.shape[1], xv.shape[1]
    if num_rows == 0:
        return out if residual is None else (out, res_out)
    args = (xv, rv, weight, out, res_out)
    strides = (b, xv.stride(0), xv.stride(1), rv.stride(0), rv.stride(1), n, float(eps))
    block_n = triton.next_power_of_2(n)
    if block_n <= MAX_TILE:
        block_r, warps = tile_rows(num_rows, block_n)
        _rms_norm_tile_kernel[(triton.cdiv(num_rows, block_r),)](
            *args, num_rows, *strides, HAS_RESIDUAL=residual is not None, BLOCK_R=block_r, BLOCK_N=block_n,
            num_warps=warps)
    else:
        _rms_norm_loop_kernel[(num_rows,)](*args, *strides, HAS_RESIDUAL=residual is not None,
                                           BLOCK_N=LOOP_BLOCK, num_warps=8)
    return out if residual is None else (out, res_out)
