"""What the kernel launchers ask of a device, looked up once per device."""
from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (4 for the CPU the Triton interpreter runs on: grid heuristics only)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def interpreting(device: torch.device) -> bool:
    """Kernels run in the Triton interpreter (or on the CPU): no inline PTX, no hardware-only conversions."""
    return device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def converts_fp8(device: torch.device) -> bool:
    """The GPU converts e4m3 in hardware (sm_89+); never under the Triton interpreter or on CPU."""
    if interpreting(device):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)
