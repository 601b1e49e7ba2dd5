"""``supports(device)`` building blocks: each returns None when the requirement holds, else the reason.

Device facts are looked up once per device (``cuda_capability``, ``sm_count``): kernels ask per call, and a
capability query costs microseconds of host time per linear in eager steps.
"""
from __future__ import annotations

import functools

import torch

from nanocore.kernels.device import sm_count  # noqa: F401  (public here since 1.4: SMs of a device, cached)


@functools.cache
def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of CUDA ``device``, or None where CUDA is not available (since 1.4; cached)."""
    return torch.cuda.get_device_capability(device) if torch.cuda.is_available() else None


@functools.cache
def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def cuda_capability_reason(device: torch.device, minimum: tuple[int, int], what: str) -> str | None:
    """None if ``device`` is a CUDA GPU of at least ``minimum`` compute capability."""
    if device.type != "cuda":
        return f"{what} needs an NVIDIA GPU (device is {device.type})"
    capability = cuda_capability(device)
    if capability is None:
        return f"{what} needs CUDA, which is not available in this torch build or machine"
    if capability < minimum:
        return f"{what} needs CUDA capability >= {minimum[0]}.{minimum[1]}, this GPU has {capability[0]}.{capability[1]}"
    return None


def triton_reason(device: torch.device, what: str) -> str | None:
    """None if Triton kernels can run on ``device`` (a CUDA GPU of capability >= 8.0 and the triton package)."""
    reason = cuda_capability_reason(device, (8, 0), what)
    if reason:
        return reason
    return None if _triton_installed() else f"{what} needs the 'triton' package (pip install triton)"


def kernel_uses_triton(kernel: str, device: torch.device, what: str, required: tuple[str, ...] = ("triton",)) -> bool:
    """Whether a method's ``kernel`` option runs its Triton kernels on ``device`` (since 1.4): ``"torch"`` never,
    ``"auto"`` (or any other choice) where Triton runs, a choice in ``required`` there or a clear error."""
    usable = device.type == "cuda" and kernel != "torch" and triton_reason(device, what) is None
    if kernel in required and not usable:
        raise RuntimeError(f"{what}: kernel={kernel!r} needs a CUDA GPU with Triton; use kernel='auto'")
    return usable
