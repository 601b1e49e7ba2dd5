"""Fused sampling for the common case: temperature (or greedy) rows, no top-k / top-p / min-p, no seeds.

One pass over the logits in their own dtype: Gumbel-max in logit space, ``argmax(l / T - log(E))`` with
``E = -log(U) ~ Exp(1)``, which samples from ``softmax(l / T)`` without the float copy, the softmax and the
noise tensor the torch path writes (six passes over ``[N, vocab]`` floats). Rows with ``T == 0`` take the
plain argmax (lowest index on ties, as ``torch.argmax``). Random numbers come from Philox keyed by a seed
tensor drawn from the engine's generator, so runs are reproducible for a given engine seed.
Each program reduces one chunk of one row; a tiny torch step combines the chunks.
Torch twin (given the same uniforms): :func:`gumbel_argmax_reference`.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the torch sampler
    triton = None

VOCAB_CHUNK = 8192  # columns per program: 19 programs per row for a 152K vocabulary
BLOCK = 1024


def gumbel_argmax_reference(logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, given its uniforms ``U [N, vocab]`` in (0, 1)."""
    temps = temperatures.float().unsqueeze(1)
    scores = logits.float() / torch.where(temps > 0, temps, torch.ones_like(temps)) - torch.log(-torch.log(uniforms))
    return torch.where(temperatures > 0, scores.argmax(dim=-1), logits.argmax(dim=-1))


if triton is not None:
    @triton.jit
    def _gumbel_argmax_chunk_kernel(logits_ptr, row_stride, temps_ptr, seed_ptr, best_val_ptr, best_idx_ptr,
                                    vocab, num_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        row, chunk = tl.program_id(0), tl.program_id(1)
        temp = tl.load(temps_ptr + row)
        inv_temp = 1.0 / tl.where(temp > 0, temp, 1.0)
        seed = tl.load(seed_ptr)
        best_val = tl.full([BLOCK], float("-inf"), tl.float32)
        best_idx = tl.zeros([BLOCK], tl.int32)
        for start in range(chunk * CHUNK, tl.minimum(chunk * CHUNK + CHUNK, vocab), BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < vocab
            logit = tl.load(logits_ptr + row * row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
            if temp > 0:
                u = tl.rand(seed, row * vocab + cols)  # distinct Philox counter per (row, column)
                score = logit * inv_temp - tl.log(-tl.log(tl.maximum(u, 1e-30)))
            else:
                score = logit
            score = tl.where(mask, score, float("-inf"))
            better = score > best_val  # strict: each lane keeps its lowest column on ties
            best_val = tl.where(better, score, best_val)
            best_idx = tl.where(better, cols, best_idx)
        top = tl.max(best_val, axis=0)
        top_idx = tl.min(tl.where(best_val == top, best_idx, 2147483647), axis=0)  # lowest column among ties
        tl.store(best_val_ptr + row * num_chunks + chunk, top)
        tl.store(best_idx_ptr + row * num_chunks + chunk, top_idx)


def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """Sampled token ids ``[N]`` (int64) from ``logits [N, vocab]`` at per-row ``temperatures [N]`` (0 = greedy).

    ``seed`` is a one-element int64 device tensor (read by the kernel, so no host sync)."""
    n, vocab = logits.shape
    if n * vocab >= 2**31:
        raise ValueError(f"fused sampling handles up to 2**31 logits per step, got {n} x {vocab}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    num_chunks = triton.cdiv(vocab, VOCAB_CHUNK)
    best_val = torch.empty((n, num_chunks), dtype=torch.float32, device=logits.device)
    best_idx = torch.empty((n, num_chunks), dtype=torch.int32, device=logits.device)
    if n:
        _gumbel_argmax_chunk_kernel[(n, num_chunks)](
            logits, logits.stride(0), temperatures, seed, best_val, best_idx, vocab, num_chunks,
            CHUNK=VOCAB_CHUNK, BLOCK=BLOCK, num_warps=4)
    chunk = best_val.argmax(dim=1, keepdim=True)  # first chunk on ties: the lowest column overall
    return best_idx.gather(1, chunk).squeeze(1).long()
