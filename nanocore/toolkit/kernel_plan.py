"""Which kernel a weight-only linear runs at each M: the thresholds, stated once for every method.

A plan lists ``(largest M, kernel)`` rows in increasing M; the last row (``None``) takes every larger M. Kernels:

* ``gemv``: M = 1, one-byte weights on the CUDA cores (:mod:`nanocore.toolkit.gemv`).
* ``cuda_gemv``: AutoAWQ's int4 GEMV in CUDA C++ (the awq plugin; ``splitk`` where nvcc cannot build it).
* ``splitk``: one row tile holds every token and K is split over programs, so each weight byte is read once.
* ``mma``: tensor-core tiles with the weight widened in registers (:mod:`nanocore.toolkit.gemm_mma`,
  :mod:`nanocore.toolkit.gemm_int4`).
* ``dequant``: the weight widened once per call into a transient buffer of the activation dtype, then the library
  GEMM (large prefill chunks, where the widening is a small share of the matrix product; the buffer is freed
  after the call, so no float copy of the weights is kept).
* ``scaled_mm``: fp8 weights with fp8 activations scaled per token (``torch._scaled_mm`` on fp8 tensor cores,
  sm_89+; ``mma`` where the GPU has none or under the Triton interpreter). Not in ``fp8_channel``'s default plan:
  rounding activations is ``fp8_w8a8``'s numerics (+1.74% perplexity on SmolLM2 against ``fp8_w8a16``'s +1% gate).

Methods declare their plan (``LinearMethod.kernel_plan``) and its switch points (``kernel_thresholds``), so the
conformance tests run each side of every threshold. ``nanocore tune linear`` times every kernel per M on a GPU.
"""
from __future__ import annotations

#: Per weight format, ``(largest M, kernel)`` rows in increasing M (measured: docs/benchmarks-quant.md).
KERNEL_PLANS: dict[str, tuple[tuple[int | None, str], ...]] = {
    "int8_channel": ((1, "gemv"), (32, "splitk"), (None, "mma")),
    "fp8_channel": ((1, "gemv"), (32, "splitk"), (None, "mma")),
    "int4_group": ((4, "cuda_gemv"), (32, "splitk"), (None, "mma")),
}
#: The weight format of each in-tree weight-only method.
METHOD_FORMATS = {"awq": "int4_group", "wna16": "int4_group", "int8_w8a16": "int8_channel",
                  "fp8_w8a16": "fp8_channel"}
KERNELS = ("gemv", "cuda_gemv", "splitk", "mma", "dequant", "scaled_mm")


def kernel_for(plan: tuple[tuple[int | None, str], ...], m: int) -> str:
    """The kernel ``plan`` runs for ``m`` tokens."""
    for largest, kernel in plan:
        if largest is None or m <= largest:
            return kernel
    raise ValueError(f"kernel plan {plan} has no row for M={m}; its last row must have no bound (None)")


def switch_points(plan: tuple[tuple[int | None, str], ...]) -> tuple[int, ...]:
    """The M values after which ``plan`` changes kernel: test M = t and t + 1 for each."""
    return tuple(largest for largest, _ in plan if largest is not None)


def check_plan(plan: tuple[tuple[int | None, str], ...]) -> None:
    """A clear error for a plan that is not increasing, names an unknown kernel, or leaves large M uncovered."""
    bounds = [largest for largest, _ in plan[:-1]]
    if not plan or plan[-1][0] is not None or None in bounds or bounds != sorted(set(bounds)):
        raise ValueError(f"a kernel plan lists (largest M, kernel) rows with increasing bounds and None last, got {plan}")
    unknown = [kernel for _, kernel in plan if kernel not in KERNELS]
    if unknown:
        raise ValueError(f"kernel plan names unknown kernels {unknown}; known: {KERNELS}")
