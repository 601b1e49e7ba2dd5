"""Token/expert alignment by sorting, on the device, without host synchronisation.

The grouped GEMMs walk ``(token, k)`` slots in blocks of ``block_m`` rows that all use one expert.
``align_slots`` sorts the ``M * K`` slots by expert and pads every expert's run to a multiple of
``block_m``. Every output has a size known from the shapes alone (the padded length is bounded by
``S + min(E, S) * (block_m - 1)``), so no count ever travels to the host and decode steps can be
captured in CUDA graphs. Slots routed to ids outside ``[0, E)`` are left out (they contribute nothing).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class AlignedSlots(NamedTuple):
    #: [num_blocks * block_m] int32: slot index (token * K + k) per row; padding rows hold ``num_slots``.
    sorted_slots: torch.Tensor
    #: [num_blocks] int32: expert of each block (blocks past ``num_rows`` hold a clamped, unused id).
    block_experts: torch.Tensor
    #: [1] int32: rows in use (a multiple of ``block_m``); blocks at or past it do nothing.
    num_rows: torch.Tensor
    num_slots: int
    block_m: int


def max_blocks(num_slots: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the blocks of one alignment: each expert in use wastes < ``block_m`` rows."""
    return -(-(num_slots + min(num_experts, num_slots) * (block_m - 1)) // block_m)


def align_slots(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedSlots:
    """Group the slots of ``topk_ids[M, K]`` by expert into ``block_m``-row blocks (see module doc)."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_slots = flat.numel()
    valid = (flat >= 0) & (flat < num_experts)
    expert = torch.where(valid, flat, num_experts)  # sentinel expert E sorts last and is dropped
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, expert, torch.ones_like(expert))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = torch.cat([padded_end.new_zeros(1), padded_end])  # [E + 1], start of each run
    sorted_expert, order = torch.sort(expert, stable=True)
    run_start = counts.cumsum(0) - counts  # where each expert's slots begin in sorted order
    position = torch.arange(num_slots, device=device) - run_start[sorted_expert]
    num_blocks = max_blocks(num_slots, num_experts, block_m)
    length = num_blocks * block_m
    dest = torch.where(sorted_expert < num_experts, padded_start[sorted_expert] + position, length)
    sorted_slots = torch.full((length + 1,), num_slots, dtype=torch.int32, device=device)
    sorted_slots.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_experts = torch.searchsorted(padded_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return AlignedSlots(sorted_slots[:length], block_experts.to(torch.int32),
                        padded_end[-1:].to(torch.int32), num_slots, block_m)
