"""The CUDA C++ decode GEMV for AutoAWQ int4 weights (``csrc/awq_gemv.cu``), M = 1..4, compiled on first use.

Launch plan: each thread owns ``words`` packed int32 columns-of-8 of every K row of its split of ``rows_per_split``
rows (any multiple of 16: a split may end inside a quantization group); ``gemv_plan`` picks them so the grid has at
least 4 blocks of 128 threads per SM and each thread walks as few rows as that allows (the walk is latency-bound).
Splits add into a zeroed fp32 ``[4, N]`` buffer kept per weight (the kernel leaves it zeroed), with one arrival counter
per column block: allocated at the first eager call, so a CUDA graph captured later reuses them.
Torch twin: :func:`nanocore_awq.kernels.awq_linear_torch`.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from nanocore.toolkit.cuda_library import CudaBuildError, arch_flags, load_cuda_library

SOURCES = [Path(__file__).resolve().parent / "csrc" / "awq_gemv.cu"]
LIBRARY = "nanocore_awq_gemv"
GEMV_MAX_M = 4
_THREADS = 128  # kThreads in the .cu
_DTYPES = {torch.float16: 0, torch.bfloat16: 1}
_reasons: dict[tuple, str | None] = {}  # (device capability) -> why the GEMV cannot run there, or None
_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (device, weight address) -> (sums, counters)
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []  # replaced workspaces a captured graph may still use


@dataclass(frozen=True)
class GemvPlan:
    words: int           # packed int32 words per thread (8 output columns each)
    rows_per_split: int  # K rows per split (blockIdx.y), a multiple of 16


def _library(capability: tuple[int, int]) -> ctypes.CDLL:
    lib = load_cuda_library(LIBRARY, SOURCES, arch_flags(capability))
    fn = lib.nanocore_awq_gemv
    if fn.restype is not ctypes.c_int or not fn.argtypes:
        p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        fn.argtypes = [i, i, i, p, i64, p, p, p, p, p, i64, p, p, i, i, i, i, i, p]
        fn.restype = ctypes.c_int
    return lib


def gemv_reason(device: torch.device) -> str | None:
    """Why the CUDA GEMV cannot run on ``device`` (no nvcc, a failed build, an old GPU), or None; builds it once."""
    if device.type != "cuda":
        return "the awq CUDA GEMV runs on NVIDIA GPUs"
    capability = torch.cuda.get_device_capability(device)
    if capability not in _reasons:
        if capability < (8, 0):
            _reasons[capability] = f"the awq CUDA GEMV needs compute capability 8.0 or newer, not {capability}"
        else:
            try:
                _library(capability)
                _reasons[capability] = None
            except (CudaBuildError, OSError) as exc:
                _reasons[capability] = str(exc)
    return _reasons[capability]


def gemv_fits(m: int, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias) -> bool:
    """Whether these operands are ones the kernel takes (else the caller runs the Triton kernels)."""
    return (1 <= m <= GEMV_MAX_M and x.dtype in _DTYPES and scales.dtype == x.dtype
            and (bias is None or bias.dtype == x.dtype) and qweight.is_contiguous() and scales.is_contiguous())


def gemv_plan(m: int, n: int, k: int, group_size: int, sms: int) -> GemvPlan:
    """One word per thread and the longest split (<= 1,024 rows, >= 64) that still gives >= 4 blocks per SM: fewer
    split sums, yet enough rows in flight on every SM. On the H200 (awq_gemv_tune.json, session 9) 8- and 16-byte
    loads were slower at every M and shape, and 32-row splits slower than 64 except o_proj at M = 1 (by 1 us)."""
    column_blocks = -(-(n // 8) // _THREADS)
    rows = 1024
    while rows > 64 and column_blocks * -(-k // rows) < 4 * sms:
        rows //= 2
    return GemvPlan(1, rows)


@functools.cache
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _workspace(device: torch.device, qweight: torch.Tensor, n: int, grid_n: int):
    """The zeroed fp32 sums ``[GEMV_MAX_M * n]`` and counters of this weight (the kernel leaves both zeroed)."""
    key = (device, qweight.data_ptr())
    found = _workspaces.get(key)
    if found is None or found[0].numel() < GEMV_MAX_M * n or found[1].numel() < grid_n:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("awq gemv: its split-K buffers must exist before CUDA-graph capture; run once eagerly")
        if found is not None:
            _retired.append(found)  # never freed: a captured graph may point at it
        found = _workspaces[key] = (torch.zeros(GEMV_MAX_M * n, dtype=torch.float32, device=device),
                                    torch.zeros(max(grid_n, n // 8), dtype=torch.int32, device=device))
    return found


def awq_gemv_cuda(x2: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  bias: torch.Tensor | None = None, plan: GemvPlan | None = None) -> torch.Tensor:
    """``x2 [M, K]`` (M <= 4, fp16 / bf16, unit column stride) times the AWQ weight -> ``[M, N]``."""
    (m, k), n = x2.shape, scales.shape[1]
    group_size = k // scales.shape[0]
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    plan = plan or gemv_plan(m, n, k, group_size, _sms(x2.device))
    words_per_row = n // 8
    if words_per_row % plan.words or plan.words * m > 4 or plan.rows_per_split % 16 or k % 32:
        raise ValueError(f"awq gemv: {plan} does not fit N = {n}, K = {k} at M = {m}")
    splits = -(-k // plan.rows_per_split)
    grid_n = -(-words_per_row // (plan.words * _THREADS))
    sums, counters = _workspace(x2.device, qweight, n, grid_n) if splits > 1 else (None, None)
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    lib = _library(torch.cuda.get_device_capability(x2.device))
    err = lib.nanocore_awq_gemv(
        _DTYPES[x2.dtype], m, plan.words, x2.data_ptr(), x2.stride(0), qweight.data_ptr(), qzeros.data_ptr(),
        scales.data_ptr(), bias.data_ptr() if bias is not None else None, y.data_ptr(), y.stride(0),
        sums.data_ptr() if sums is not None else None, counters.data_ptr() if counters is not None else None,
        n, k, group_size, splits, plan.rows_per_split, torch.cuda.current_stream(x2.device).cuda_stream)
    if err:
        raise RuntimeError(f"awq gemv: launch failed (CUDA error {err}) for M={m}, N={n}, K={k}, {plan}")
    return y
