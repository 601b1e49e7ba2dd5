"""Triton grouped GEMMs over aligned slots; the torch twin is ``reference.fused_moe_torch``.

Kernel 1: ``h[slot] = silu(x[token] @ w13[e, :I]^T) * (x[token] @ w13[e, I:]^T)`` (gate and up tiles
share the loads of ``x``; SiLU-and-mul happens in registers). Kernel 2: ``y[slot] = weight[slot] *
(h[slot] @ w2[e]^T)`` in fp32; the launcher sums ``y`` over ``top_k``. One program owns one block of
``BLOCK_M`` aligned rows (one expert) times ``BLOCK_N`` output columns and returns at once for blocks
past ``num_rows``, so the grid depends on shapes only (CUDA-graph safe).

fp8 experts (``fp8_channel``, ``FP8`` constexpr): B tiles are read as bytes (a uint8 view: a masked load of an fp8
tensor cannot take ``other=0``), bitcast to fp8 e4m3 and converted to ``x``'s dtype in registers (exact); each
output column's float32 scale multiplies the fp32 accumulator after the K loop: the gate and up columns each their
own, before SiLU-and-mul; the down columns before the routing weight.
"""
from __future__ import annotations

import functools
import types

import torch
import triton
import triton.language as tl

from nanocore_triton_fused_moe.align import AlignedSlots


def _block_coords(num_blocks, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: neighbouring programs reuse the same expert weight tiles from L2."""
    pid = tl.program_id(0)
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N  # plain arithmetic: tl.cdiv is itself jitted
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    return pid_m, pid_n


def _load_b(ptrs, mask, FP8: tl.constexpr):
    """A weight tile as stored, or fp8 e4m3 from its bytes (the caller widens it to the activations' dtype)."""
    if FP8:
        b = tl.load(ptrs, mask=mask, other=0).to(tl.float8e4nv, bitcast=True)
    else:
        b = tl.load(ptrs, mask=mask, other=0.0)
    return b


def gate_up_silu_kernel(x_ptr, w13_ptr, s13_ptr, h_ptr, sorted_slots_ptr, block_experts_ptr, num_rows_ptr,
                        num_blocks, N, K, num_slots, top_k,
                        stride_xm, stride_we, stride_wn, stride_se, stride_hm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr):
    pid_m, pid_n = _block_coords(num_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_slots_ptr + offs_m)
    row_ok = slots < num_slots
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + (slots // top_k).to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    g_ptrs = w13_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc_u = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        g = _load_b(g_ptrs, k_ok[:, None] & n_ok[None, :], FP8).to(x_ptr.dtype.element_ty)
        u = _load_b(u_ptrs, k_ok[:, None] & n_ok[None, :], FP8).to(x_ptr.dtype.element_ty)
        acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if FP8:  # per output column: gate rows [0, N), up rows [N, 2N) of w13_scale[expert]
        s_ptrs = s13_ptr + expert * stride_se + offs_n
        acc_g = acc_g * tl.load(s_ptrs, mask=n_ok, other=0.0)[None, :]
        acc_u = acc_u * tl.load(s_ptrs + N, mask=n_ok, other=0.0)[None, :]
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    h_ptrs = h_ptr + slots.to(tl.int64)[:, None] * stride_hm + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def down_kernel(h_ptr, w2_ptr, s2_ptr, y_ptr, weights_ptr, sorted_slots_ptr, block_experts_ptr, num_rows_ptr,
                num_blocks, N, K, num_slots,
                stride_hm, stride_we, stride_wn, stride_se, stride_ym,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr):
    pid_m, pid_n = _block_coords(num_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_slots_ptr + offs_m)
    row_ok = slots < num_slots
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + slots.to(tl.int64)[:, None] * stride_hm + offs_k[None, :]
    b_ptrs = w2_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = _load_b(b_ptrs, k_ok[:, None] & n_ok[None, :], FP8).to(h_ptr.dtype.element_ty)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if FP8:  # the scale of each output column, before the routing weight
        acc = acc * tl.load(s2_ptr + expert * stride_se + offs_n, mask=n_ok, other=0.0)[None, :]
    weight = tl.load(weights_ptr + slots, mask=row_ok, other=0.0)
    acc = acc * weight[:, None]
    y_ptrs = y_ptr + slots.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc, mask=row_ok[:, None] & n_ok[None, :])


@functools.lru_cache(maxsize=None)
def _compiled(interpret: bool):
    """JIT kernels for the GPU; interpreted ones for CPU tensors (tests), whatever TRITON_INTERPRET says.

    The kernels therefore call only builtin ``tl`` functions (the jitted standard library, e.g.
    ``tl.cdiv``, cannot run in an interpreter that was not enabled at import).
    """
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction as wrap
    else:
        wrap = triton.jit
    # the helpers must be wrapped like their callers
    scope = dict(globals(), _block_coords=wrap(_block_coords), _load_b=wrap(_load_b))
    # sizes that change with the batch are not specialised on: no recompilation per decode batch size
    return tuple(wrap(_rebind(fn, scope), do_not_specialize=["num_blocks", "num_slots"])
                 for fn in (gate_up_silu_kernel, down_kernel))


def _rebind(fn, scope: dict):
    """``fn`` resolving globals in ``scope``; annotations kept (they mark the constexpr parameters)."""
    rebound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
    rebound.__annotations__ = dict(fn.__annotations__)
    return rebound


def fused_experts(x: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  aligned: AlignedSlots, top_k: int, config: dict, w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Both grouped GEMMs over ``aligned`` slots, then the fp32 sum over ``top_k``: ``[M, H]`` in ``x.dtype``.

    With ``w13_scale[E,2I]`` / ``w2_scale[E,H]`` (float32), ``w13`` / ``w2`` are fp8 e4m3 (``fp8_channel``)."""
    gate_up, down = _compiled(x.device.type == "cpu")
    num_tokens, hidden = x.shape
    intermediate = w2.shape[2]
    num_slots, num_blocks = aligned.num_slots, aligned.block_experts.shape[0]
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    fp8 = w13_scale is not None
    if fp8:  # bytes: masked loads need an integer 'other'; the kernels bitcast them back to fp8
        w13, w2 = w13.view(torch.uint8), w2.view(torch.uint8)
        s13, s2 = w13_scale.float().contiguous(), w2_scale.float().contiguous()
    else:
        s13 = s2 = topk_weights  # never read (FP8 is False)
    weights = topk_weights.reshape(-1).float()
    h = torch.empty(num_slots, intermediate, dtype=x.dtype, device=x.device)
    y = torch.zeros(num_slots, hidden, dtype=torch.float32, device=x.device)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    tiles = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    launch = {k: config[k] for k in ("num_warps", "num_stages")} if x.is_cuda else {}
    grid = (num_blocks * triton.cdiv(intermediate, tiles["BLOCK_N"]),)
    gate_up[grid](x, w13, s13, h, aligned.sorted_slots, aligned.block_experts, aligned.num_rows,
                  num_blocks, intermediate, hidden, num_slots, top_k,
                  x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), h.stride(0),
                  PRECISION=precision, FP8=fp8, **tiles, **launch)
    grid = (num_blocks * triton.cdiv(hidden, tiles["BLOCK_N"]),)
    down[grid](h, w2, s2, y, weights, aligned.sorted_slots, aligned.block_experts, aligned.num_rows,
               num_blocks, hidden, intermediate, num_slots,
               h.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), y.stride(0),
               PRECISION=precision, FP8=fp8, **tiles, **launch)
    return y.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
