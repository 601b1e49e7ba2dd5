"""Pieces the weight-only GEMMs share: K slices summed by the last program to arrive, weight widening, tile order.

:func:`split_k_for` picks K slices, :func:`splitk_workspace` owns the fp32 partials and per-weight arrival counters,
and the Triton helpers (:func:`splitk_finish`, :func:`widen`, :func:`grouped_tile`, :func:`e4m3_bits_to_fp16`) are
``@triton.jit`` functions that :mod:`nanocore.toolkit.gemm`, :mod:`nanocore.toolkit.gemv`,
:mod:`nanocore.toolkit.gemm_block` and plugins call from their kernels.
"""
from __future__ import annotations

import torch

from nanocore.kernels.device import sm_count

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the torch references
    triton = None

#: Weight encodings the kernels read: int8 values, fp8 loaded natively, fp8 bits widened with integer ops.
W_INT8, W_FP8, W_FP8_BITS = 0, 1, 2


def split_k_for(grid_n: int, k_tiles: int, device: torch.device, requested: int = 0) -> int:
    """K slices: enough programs for ~4 per SM, each slice at least two K tiles long."""
    if requested:
        return max(1, min(requested, k_tiles))
    want = -(-4 * sm_count(device) // grid_n)
    return max(1, min(want, k_tiles // 2, 16))


#: Arrival counters per (device, weight): two split-K GEMMs that overlap on different streams (a shared
#: expert on its side stream) must not share counters; one weight's calls run in stream order.
_LOCKS: dict[tuple[torch.device, int], torch.Tensor] = {}
_RETIRED_LOCKS: list[torch.Tensor] = []


def splitk_workspace(split_k: int, m: int, n: int, grid_n: int, device: torch.device, weight: torch.Tensor):
    """fp32 partials ``[split_k, m, n]`` and ``weight``'s per-column-block arrival counters (kept at zero)."""
    if split_k == 1:
        return None, None
    key = (device, weight.data_ptr())
    locks = _LOCKS.get(key)
    if locks is None or locks.numel() < grid_n:  # counters reset themselves, so one buffer serves every call
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split-K counters must be allocated before CUDA-graph capture; run once eagerly")
        if locks is not None:
            _RETIRED_LOCKS.append(locks)  # a captured graph may still point at it: never free it
        # room for the narrowest column blocks (8) at once: a graph captured with one config never sees a
        # buffer replaced by another config's larger one
        locks = _LOCKS[key] = torch.zeros(max(grid_n, -(-n // 8), 64), dtype=torch.int32, device=device)
    return torch.empty((split_k, m, n), dtype=torch.float32, device=device), locks


if triton is not None:
    @triton.jit
    def e4m3_bits_to_fp16(bits):
        """fp8 e4m3 bit patterns (uint8) -> fp16 holding value / 256 (exact, subnormals included)."""
        b = bits.to(tl.int16)
        h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
        return h.to(tl.float16, bitcast=True)

    @triton.jit
    def zero_of(ptr):
        """A zero of the pointee's type for masked loads (a Python 0 does not cast to fp8)."""
        return tl.full((), 0, ptr.dtype.element_ty)

    @triton.jit
    def widen(w, W_KIND: tl.constexpr, dtype: tl.constexpr):
        """Stored weights -> ``dtype`` (int8 exact, fp8 native, or fp8 bits as value / 256)."""
        if W_KIND == 2:
            return e4m3_bits_to_fp16(w).to(dtype)
        return w.to(dtype)

    @triton.jit
    def splitk_finish(acc, y_ptr, b_ptr, part_ptr, lock_ptr, offs_m, offs_n, M, N, stride_ym,
                      HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
        """Store ``acc`` (+ bias); with split-K the last of the K slices of this column block sums them."""
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        out = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            mn = offs_m[:, None] * N + offs_n[None, :]
            tl.store(part_ptr + tl.program_id(1) * M * N + mn, acc, mask=mask)
            tl.debug_barrier()  # every thread's partial is written before the release below
            arrived = tl.atomic_add(lock_ptr + tl.program_id(0), 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                total = tl.zeros_like(acc)
                for i in range(SPLIT_K):  # .cg: other SMs' partials live in L2, not in this SM's L1
                    total += tl.load(part_ptr + i * M * N + mn, mask=mask, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(lock_ptr + tl.program_id(0), 0)  # ready for the next launch
                if HAS_BIAS:
                    total += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
                tl.store(out, total.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        """(row tile, column tile) of program ``pid`` in grouped order: neighbours share weight tiles in L2."""
        grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        first_m = (pid // (GROUP_M * grid_n)) * GROUP_M
        size_m = min(grid_m - first_m, GROUP_M)
        return first_m + (pid % (GROUP_M * grid_n)) % size_m, (pid % (GROUP_M * grid_n)) // size_m
