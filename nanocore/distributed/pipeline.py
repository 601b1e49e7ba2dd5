"""Pipeline stages: which decoder layers a stage holds, and the point-to-point messages between stages.

Ranks are laid out stage-major: stage ``s`` holds global ranks ``[s * width, (s + 1) * width)``, ``width`` being
the ranks of one stage (max(TP, EP)), so the tensor-parallel groups stay inside a stage. Rank ``r`` of a stage
talks to rank ``r`` of the next: each holds the whole hidden states (replicated after the TP all-reduce).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StageLayers:
    """The decoder layers ``[start, end)`` of one stage; the first also embeds, the last also norms and projects."""

    start: int
    end: int
    is_first: bool
    is_last: bool

    def __contains__(self, layer_idx: int) -> bool:
        return self.start <= layer_idx < self.end


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> StageLayers:
    """An even split of ``num_layers`` over ``pp_size`` stages; the first ``num_layers % pp_size`` get one more."""
    if num_layers < pp_size:
        raise ValueError(f"pipeline_parallel_size {pp_size} needs at least {pp_size} decoder layers but the model "
                         f"has {num_layers}; lower pipeline_parallel_size to at most {num_layers}")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return StageLayers(start, start + base + (pp_rank < extra), pp_rank == 0, pp_rank == pp_size - 1)


@dataclass(frozen=True)
class StagePeers:
    """This rank's neighbours (global ranks) and the rank that samples: the last stage's first rank."""

    rank: int
    width: int  # ranks per stage
    pp_size: int

    @property
    def pp_rank(self) -> int:
        return self.rank // self.width

    @property
    def is_first(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def sampler(self) -> int:
        return (self.pp_size - 1) * self.width

    @property
    def prev(self) -> int:
        return self.rank - self.width

    @property
    def next(self) -> int:
        return self.rank + self.width


def send_tensors(tensors: list[torch.Tensor], dst: int) -> list:
    """Start sending ``tensors`` to ``dst`` (the receiver knows their shapes); wait on the returned works."""
    return [dist.isend(t.contiguous(), dst) for t in tensors]


def recv_tensors(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device,
                 src: int) -> list[torch.Tensor]:
    """Tensors of known ``shapes`` from ``src``, in the order it sent them."""
    out = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
    for work in [dist.irecv(t, src) for t in out]:
        work.wait()
    return out


def send_bytes(data: bytes, dst: int, device: torch.device) -> None:
    """``data`` to ``dst``: its length, then the bytes (on ``device``: NCCL moves device tensors only)."""
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.send(length, dst)
    if data:
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device), dst)


def recv_bytes(src: int, device: torch.device) -> bytes:
    length = torch.empty(1, dtype=torch.int64, device=device)
    dist.recv(length, src)
    payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    if payload.numel():
        dist.recv(payload, src)
    return payload.cpu().numpy().tobytes()
