"""Paged attention over the KV codec's cache: metadata, the torch reference path and the layer.

One forward handles a mixed batch: sequence ``b`` contributes the query tokens
``query_start_loc[b]:query_start_loc[b+1]`` (a prefill chunk or one decode token) and attends to its
``seq_lens[b]`` cached tokens, the last of which are its own new tokens (lower-right causal alignment).
The new K/V are stored through the codec first; a chunk of 2+ tokens then attends to its own tokens in the
model dtype (``k_new``/``v_new``: no quantization round trip within the chunk) and to the earlier tokens through
the codec, while a decode token reads itself back from the cache like every earlier token (in CUDA graphs too:
decode batches never read ``k_new``). ``AttentionMetadata.kv_from_cache`` reads every position from the cache
(perplexity scoring measures the codec that way).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from nanocore.interfaces import KVCache, KVCodec


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step; built by the ModelRunner, passed down explicitly."""

    #: [num_tokens] int64: cache slot of each new token's K/V (-1: do not store, e.g. padding).
    slot_mapping: torch.Tensor
    #: [num_seqs + 1] int32: cumulative query lengths (cu_seqlens_q).
    query_start_loc: torch.Tensor
    #: [num_seqs] int32: KV length of each sequence after this step (cached + new tokens).
    seq_lens: torch.Tensor
    #: [num_seqs, max_blocks] int32: KV block ids per sequence (padding entries are never read).
    block_tables: torch.Tensor | None
    max_query_len: int
    max_seq_len: int
    #: One KVCache per layer; None runs attention over the new tokens only (no cache, prefill only).
    kv_caches: list[KVCache] | None = None
    codec: KVCodec | None = None
    #: Host copies for the torch reference path (avoid device syncs); filled by the ModelRunner.
    query_lens_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None
    #: "auto" (Triton on CUDA when available, else torch) or "torch".
    impl: str = "auto"
    #: True: the step's own tokens too are read back from the cache through the codec (eval scoring);
    #: False: a chunk of 2+ tokens attends to its own K/V in the model dtype.
    kv_from_cache: bool = False
    #: Piecewise CUDA graphs (runner/piecewise_graphs.py): called by each attention layer with its q/k/v
    #: ``[T, heads, head_dim]`` instead of storing and attending; returns the ``[T, heads * head_dim]`` output rows.
    segment_break: Callable[[Attention, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: [num_seqs] int32, set for pure decode steps (unless ``attention_decode_order`` is "batch"): a grid of one
    #: query tile per sequence launches row ``decode_order[i]`` as its i-th (a permutation of the rows; None: in order).
    decode_order: torch.Tensor | None = None
    #: The attention kernels' launch plan (choice, path constexprs, flags, tiles) per layer shape and cache layout,
    #: memoised for the step (``paged_attention``).
    launch_choices: dict = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @classmethod
    def for_prefill(cls, query_lens: list[int], device: torch.device | str = "cpu") -> AttentionMetadata:
        """Metadata for plain causal prefill without a KV cache (tests, perplexity)."""
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        return cls(
            slot_mapping=torch.full((starts[-1],), -1, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(query_lens, dtype=torch.int32, device=device),
            block_tables=None, max_query_len=max(query_lens), max_seq_len=max(query_lens),
            query_lens_cpu=list(query_lens), seq_lens_cpu=list(query_lens),
        )


def causal_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """``q[lq,Hq,D]`` over ``k, v [lk,Hkv,D]`` with the causal mask aligned to the lower right."""
    lq, num_heads, _ = q.shape
    lk, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    # query i sits at absolute position lk - lq + i and sees keys 0..lk-lq+i
    mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(),
        attn_mask=mask, scale=scale,
    )
    return out.transpose(0, 1).to(q.dtype)


def block_slots(block_table_row: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """Cache slots of the first ``seq_len`` tokens of a sequence, from its block-table row."""
    num_blocks = -(-seq_len // block_size)
    blocks = block_table_row[:num_blocks].long()
    offsets = torch.arange(block_size, device=blocks.device)
    return (blocks[:, None] * block_size + offsets).flatten()[:seq_len]


def paged_attention_reference(
    q: torch.Tensor, k_new: torch.Tensor | None, v_new: torch.Tensor | None, cache: KVCache | None,
    meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """Torch reference: per sequence, gather (dequantize) its cached KV through the codec and run SDPA.

    A chunk of 2+ tokens takes its own K/V from ``k_new``/``v_new`` (rows ``query_start_loc[b]`` on), unless
    ``meta.kv_from_cache`` or ``k_new`` is None; then every position is gathered from the cache.
    """
    query_lens = meta.query_lens_cpu or (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()
    seq_lens = meta.seq_lens_cpu or meta.seq_lens.tolist()
    fresh = k_new is not None and not meta.kv_from_cache
    out = torch.empty_like(q)
    start = 0
    for b, (lq, lk) in enumerate(zip(query_lens, seq_lens)):
        if lq == 0:
            continue
        if cache is None:
            k, v = k_new[start:start + lq], v_new[start:start + lq]
        else:
            own = fresh and lq > 1
            num_cached = lk - lq if own else lk
            if num_cached:
                k, v = meta.codec.gather(cache, block_slots(meta.block_tables[b], num_cached, cache.block_size),
                                         q.dtype)
            else:  # a first chunk: nothing cached before it
                k = v = q.new_empty(0, *k_new.shape[1:])
            if own:
                k = torch.cat([k, k_new[start:start + lq].to(q.dtype)])
                v = torch.cat([v, v_new[start:start + lq].to(q.dtype)])
        out[start:start + lq] = causal_attention_reference(q[start:start + lq], k, v, scale)
        start += lq
    return out


class Attention(nn.Module):
    """Stores this layer's new K/V through the codec, then attends over the paged cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.layer_idx = layer_idx

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if meta.segment_break is not None:  # a piecewise graph is cut here; attention runs between replays
            return meta.segment_break(self, q, k, v)
        return self.attend(q, k, v, meta).reshape(-1, self.num_heads * self.head_dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Store the new K/V through the codec, then attend: ``[T, heads, head_dim]`` in and out."""
        cache = None
        if meta.kv_caches is not None:
            cache = meta.kv_caches[self.layer_idx]
            meta.codec.store(cache, k, v, meta.slot_mapping)
        return attention_forward(q, k, v, cache, meta, self.scale)


def attention_forward(q, k, v, cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Dispatch to the Triton kernels on CUDA, else to the torch reference."""
    if meta.impl == "auto" and q.is_cuda:
        from nanocore.kernels import attention_dispatch
        if attention_dispatch.available():
            return attention_dispatch.paged_attention(q, k, v, cache, meta, scale)
    return paged_attention_reference(q, k, v, cache, meta, scale)
