"""``supports(device)`` building blocks: each returns None when the requirement holds, else the reason."""
from __future__ import annotations

import torch


def cuda_capability_reason(device: torch.device, minimum: tuple[int, int], what: str) -> str | None:
    """None if ``device`` is a CUDA GPU of at least ``minimum`` compute capability."""
    if device.type != "cuda":
        return f"{what} needs an NVIDIA GPU (device is {device.type})"
    if not torch.cuda.is_available():
        return f"{what} needs CUDA, which is not available in this torch build or machine"
    capability = torch.cuda.get_device_capability(device)
    if capability < minimum:
        return f"{what} needs CUDA capability >= {minimum[0]}.{minimum[1]}, this GPU has {capability[0]}.{capability[1]}"
    return None


def triton_reason(device: torch.device, what: str) -> str | None:
    """None if Triton kernels can run on ``device`` (a CUDA GPU of capability >= 8.0 and the triton package)."""
    reason = cuda_capability_reason(device, (8, 0), what)
    if reason:
        return reason
    try:
        import triton  # noqa: F401
    except ImportError:
        return f"{what} needs the 'triton' package (pip install triton)"
    return None
