"""Bytes between ranks over a CPU (gloo) process group: a length, then a uint8 tensor. The bytes are the caller's
typed encoding (nanocore.runner.wire); nothing here unpickles."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

#: the message group waits on rank 0 for as long as an idle server stays up; a dead peer is the heartbeat's job
IDLE_TIMEOUT = timedelta(days=365)


def new_message_group():
    """A gloo group of every rank for messages (every rank must call this, in the same order as other groups)."""
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


def broadcast_bytes(data: bytes | None, group, src: int = 0) -> bytes:
    """``data`` on rank ``src`` (None elsewhere); every rank returns it."""
    length = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
    dist.broadcast(length, src=src, group=group)
    if data is not None and dist.get_rank() == src:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    else:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    dist.broadcast(payload, src=src, group=group)
    return data if dist.get_rank() == src else payload.numpy().tobytes()


def all_gather_bytes(data: bytes, group) -> list[bytes]:
    """Every rank's ``data``, in rank order (lengths first, then the payloads padded to the longest)."""
    world = dist.get_world_size(group)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64), group=group)
    longest = max(int(n.item()) for n in lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
    parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [part[:int(n.item())].numpy().tobytes() for part, n in zip(parts, lengths)]
