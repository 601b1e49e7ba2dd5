"""Packed token bitmasks (since 1.5): xgrammar's layout, int32 ``[batch, ceil(vocab_size / 32)]``, token ``t``
allowed when bit ``t % 32`` of word ``t // 32`` is set. Pack, unpack, and apply to logits on any device."""
from __future__ import annotations

import torch

BITS = 32


def bitmask_words(vocab_size: int) -> int:
    return -(-vocab_size // BITS)


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU bitmask with every token allowed (-1 sets all 32 bits of a word)."""
    return torch.full((batch_size, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def _bit_positions(device: torch.device) -> torch.Tensor:
    return torch.arange(BITS, dtype=torch.int32, device=device)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[..., vocab_size]``: True where the token is allowed. Ids past the mask's width are not allowed."""
    bits = (bitmask.unsqueeze(-1) >> _bit_positions(bitmask.device)) & 1
    allowed = bits.flatten(-2).bool()
    width = allowed.shape[-1]
    if width >= vocab_size:
        return allowed[..., :vocab_size]
    pad = torch.zeros(*allowed.shape[:-1], vocab_size - width, dtype=torch.bool, device=allowed.device)
    return torch.cat([allowed, pad], dim=-1)


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """The packed int32 bitmask of a bool ``[..., vocab_size]`` tensor (inverse of ``unpack_bitmask``)."""
    vocab_size = allowed.shape[-1]
    words = bitmask_words(vocab_size)
    padded = torch.zeros(*allowed.shape[:-1], words * BITS, dtype=torch.int64, device=allowed.device)
    padded[..., :vocab_size] = allowed.to(torch.int64)
    weights = torch.ones(BITS, dtype=torch.int64, device=allowed.device) << _bit_positions(allowed.device).long()
    packed = (padded.view(*allowed.shape[:-1], words, BITS) * weights).sum(-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)  # two's complement


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """Set the logits of forbidden tokens to -inf, in place. ``logits`` ``[batch, vocab]`` on any device;
    ``bitmask`` ``[rows, words]`` (moved to ``logits``' device). Without ``indices`` row ``i`` of the mask masks
    logits row ``i``; with them, mask row ``i`` masks logits row ``indices[i]`` (the constrained rows of a batch).
    Tokens past the mask's width are forbidden."""
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"expected logits [batch, vocab] and an int32 bitmask [rows, words], got "
                         f"{tuple(logits.shape)} and {tuple(bitmask.shape)} {bitmask.dtype}")
    rows = bitmask.shape[0] if indices is None else len(indices)
    if rows != bitmask.shape[0] or (indices is None and rows != logits.shape[0]):
        raise ValueError(f"the bitmask has {bitmask.shape[0]} rows for {rows} logits rows; pass `indices` naming "
                         f"the logits row of each mask row")
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[-1])
    if indices is None:
        logits.masked_fill_(~allowed, float("-inf"))
        return
    index = torch.as_tensor(indices, dtype=torch.long, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def fill_bitmask_row(bitmask: torch.Tensor, row: int, token_ids, vocab_size: int) -> None:
    """Write a mask row allowing exactly ``token_ids`` (a reference for slow backends and tests)."""
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    allowed[torch.as_tensor(list(token_ids), dtype=torch.long)] = True
    bitmask[row] = pack_bitmask(allowed)
