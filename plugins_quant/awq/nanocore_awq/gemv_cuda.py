"""The CUDA C++ decode GEMV for AutoAWQ int4 weights (``csrc/awq_gemv.cu``), M = 1..4, compiled on first use.

Launch plan: each thread owns ``words`` packed int32 columns-of-8 of every K row of its split of ``rows_per_split``
rows (any multiple of 16: a split may end inside a quantization group); ``gemv_plan`` picks the longest split that
still gives every SM at least 4 blocks of 128 threads. Splits add into a zeroed fp32 ``[4, N]`` buffer with one
arrival counter per column block (the kernel leaves both zeroed); they hang on the weight tensor itself, created at
its first eager call, so a CUDA graph captured later reuses them and they are freed with the weight.
Torch twin: :func:`nanocore_awq.kernels.awq_linear_torch`.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from nanocore.toolkit.capability import cuda_capability, cuda_capability_reason, sm_count
from nanocore.toolkit.cuda_library import CudaBuildError, arch_flags, load_cuda_library

SOURCES = [Path(__file__).resolve().parent / "csrc" / "awq_gemv.cu"]
LIBRARY = "nanocore_awq_gemv"
GEMV_MAX_M = 4
_THREADS = 128  # kThreads in the .cu
_DTYPES = {torch.float16: 0, torch.bfloat16: 1}
_WORKSPACE = "_nanocore_awq_gemv_workspace"  # attribute of the qweight tensor: (sums, counters)


@dataclass(frozen=True)
class GemvPlan:
    words: int           # packed int32 words per thread (8 output columns each): 1, 2 or 4, words * M <= 4
    rows_per_split: int  # K rows per split (blockIdx.y), a multiple of 16


@functools.cache
def _library(capability: tuple[int, int]) -> ctypes.CDLL:
    lib = load_cuda_library(LIBRARY, SOURCES, arch_flags(capability))
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.nanocore_awq_gemv.argtypes = [i, i, i, p, i64, p, p, p, p, p, i64, p, p, i, i, i, i, i, p]
    lib.nanocore_awq_gemv.restype = i
    lib.nanocore_awq_error_string.argtypes = [i]
    lib.nanocore_awq_error_string.restype = ctypes.c_char_p
    return lib


def gemv_reason(device: torch.device) -> str | None:
    """Why the CUDA GEMV cannot run on ``device`` (no nvcc, a failed build, an old GPU), or None; builds it once."""
    return cuda_capability_reason(device, (8, 0), "the awq CUDA GEMV") or _build_failure(cuda_capability(device))


@functools.cache
def _build_failure(capability: tuple[int, int]) -> str | None:
    try:
        _library(capability)
    except (CudaBuildError, OSError, AttributeError) as exc:
        return str(exc)
    return None


def gemv_fits(m: int, x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              bias) -> bool:
    """Whether these operands are ones the kernel takes (else the caller runs the Triton kernels): M <= 4, fp16 /
    bf16 throughout, contiguous tensors, K and the group size multiples of 16 (the kernel walks 16 rows at a time)."""
    k, groups = qweight.shape[0], scales.shape[0]
    return (1 <= m <= GEMV_MAX_M and x.dtype in _DTYPES and scales.dtype == x.dtype and groups > 0
            and k % groups == 0 and (k // groups) % 16 == 0
            and all(t.is_contiguous() for t in (qweight, qzeros, scales))
            and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous())))


@functools.cache
def gemv_plan(n: int, k: int, sms: int) -> GemvPlan:
    """One word per thread and the longest split (<= 1,024 rows, >= 64) that still gives >= 4 blocks per SM: fewer
    split sums, yet enough rows in flight on every SM. On the H200 8- and 16-byte
    loads were slower at every M and shape, and 32-row splits slower than 64 except o_proj at M = 1 (by 1 us)."""
    column_blocks = -(-(n // 8) // _THREADS)
    rows = 1024
    while rows > 64 and column_blocks * -(-k // rows) < 4 * sms:
        rows //= 2
    return GemvPlan(1, rows)


def _workspace(qweight: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This weight's zeroed fp32 sums ``[GEMV_MAX_M * n]`` and counters (one per column block of one word)."""
    found = getattr(qweight, _WORKSPACE, None)
    if found is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("awq gemv: its split-K buffers must exist before CUDA-graph capture; run once eagerly")
        found = (torch.zeros(GEMV_MAX_M * n, dtype=torch.float32, device=qweight.device),
                 torch.zeros(-(-(n // 8) // _THREADS), dtype=torch.int32, device=qweight.device))
        setattr(qweight, _WORKSPACE, found)
    return found


def awq_gemv_cuda(x2: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  bias: torch.Tensor | None = None, plan: GemvPlan | None = None) -> torch.Tensor:
    """``x2 [M, K]`` (operands as ``gemv_fits`` accepts) times the AWQ weight -> ``[M, N]``."""
    (m, k), n = x2.shape, scales.shape[1]
    if not gemv_fits(m, x2, qweight, qzeros, scales, bias):
        raise ValueError(f"awq gemv: M={m}, K={k}, {scales.shape[0]} groups, x {x2.dtype} / scales {scales.dtype} is "
                         f"not a case the CUDA GEMV takes (M <= {GEMV_MAX_M}, fp16 / bf16, contiguous, K and group "
                         f"size multiples of 16); use awq_linear_triton")
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    plan = plan or gemv_plan(n, k, sm_count(x2.device))
    if plan.words not in (1, 2, 4) or (n // 8) % plan.words or plan.words * m > 4 or plan.rows_per_split % 16:
        raise ValueError(f"awq gemv: {plan} does not fit N = {n} at M = {m} (words 1, 2 or 4 dividing N / 8, "
                         f"words * M <= 4, rows a multiple of 16)")
    splits = -(-k // plan.rows_per_split)
    sums, counters = _workspace(qweight, n) if splits > 1 else (None, None)
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    lib = _library(cuda_capability(x2.device))
    with torch.cuda.device(x2.device):  # ctypes launches into the current device's context
        err = lib.nanocore_awq_gemv(
            _DTYPES[x2.dtype], m, plan.words, x2.data_ptr(), x2.stride(0), qweight.data_ptr(), qzeros.data_ptr(),
            scales.data_ptr(), bias.data_ptr() if bias is not None else None, y.data_ptr(), y.stride(0),
            sums.data_ptr() if sums is not None else None, counters.data_ptr() if counters is not None else None,
            n, k, k // scales.shape[0], splits, plan.rows_per_split, torch.cuda.current_stream(x2.device).cuda_stream)
    if err:
        raise RuntimeError(f"awq gemv: launch failed ({lib.nanocore_awq_error_string(err).decode()}) for M={m}, "
                           f"N={n}, K={k}, {plan}")
    return y
