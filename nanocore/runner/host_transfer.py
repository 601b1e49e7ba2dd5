"""Host <-> device copies that do not stall the host: pinned staging on CUDA, plain tensors on CPU.

A copy from pageable host memory may wait for the stream to drain, which would serialise the next
step's preparation with the current step's GPU work; pinned memory lets both copies run in the
stream's order while the host goes on. Pinned blocks come from torch's caching host allocator, which
keeps a block until the copies that read or write it are done, so each call may allocate afresh.
"""
from __future__ import annotations

import numpy as np
import torch


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` on ``device`` through one pinned, non-blocking copy (CPU: shares the array's memory)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class HostCopy:
    """A device tensor's copy to the host, started now and waited for only when read."""

    __slots__ = ("host", "event")

    def __init__(self, tensor: torch.Tensor):
        if tensor.device.type != "cuda":
            self.host, self.event = tensor, None
            return
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self.host.copy_(tensor, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()  # only this copy (and the work before it), not the whole device
        return self.host.tolist()
