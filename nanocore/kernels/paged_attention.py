"""Host side of the Triton paged attention (kernels in ``paged_attention_kernel`` and ``split_kv``), twin of the
torch reference.

``paged_attention`` reads the codec's layout, picks the launch config and the quantized path, and launches
the attention kernel (plus the split-KV merge). Which KV positions come from where, as in
``paged_attention_reference``: a chunk of 2+ tokens attends to its own K/V in the model dtype (``k_new`` /
``v_new``) and to the earlier, cached tokens through the codec; a decode row reads everything from the cache;
``meta.kv_from_cache`` (perplexity scoring) or ``k_new`` None reads every position from the cache.
"""
from __future__ import annotations

import torch
import triton

from nanocore.interfaces import KVCache, KVLayout
from nanocore.kernels.attention_config import (  # noqa: F401  (re-exported for tests and benchmarks)
    DECODE_HEADS_FIRST, DEFAULT_QUANT_PATH, GROUP_K_DECODE_TILE, NARROW_DECODE_TILE, QUANT_PATHS, AttentionConfig,
    batch_choice, default_config, fp16_path)
from nanocore.kernels.device import sm_count
from nanocore.kernels.kv_store import SCALE_CODES  # scale granularity -> constexpr code, one table for both kernels
from nanocore.kernels.narrow_attention import narrow_constexprs
from nanocore.kernels.paged_attention_kernel import paged_attention_kernel
from nanocore.kernels.split_kv import merge_splits_kernel

LOG2E = 1.4426950408889634


def _layout_args(cache: KVCache | None, layout: KVLayout | None, k_new, v_new):
    """(k, v, k_scale, v_scale, scale codes, group sizes, strides, page size) the kernel reads."""
    if cache is None:
        if k_new is None or v_new is None:
            raise ValueError("paged_attention without a cache attends over k_new / v_new: pass both")
        k, v, ks, vs, page = k_new, v_new, None, None, 1
        codes, groups = (0, 0), (1, 1)
    else:
        k, v, ks, vs, page = cache.k, cache.v, cache.k_scale, cache.v_scale, cache.block_size
        k_mode, v_mode = (layout.k_scale, layout.v_scale) if layout is not None else ("none", "none")
        codes = (SCALE_CODES[k_mode], SCALE_CODES[v_mode])
        groups = tuple(max(layout.group_size, 1) if layout is not None else 1 for _ in range(2))
        k = k.view(-1, *k.shape[2:])  # [num_slots, Hkv, D]
        v = v.view(-1, *v.shape[2:])
    for x in (k, v):
        if x.stride(-1) != 1:
            raise ValueError("paged_attention needs head_dim contiguous K/V tensors")
    ks = ks.view(-1, *ks.shape[2:]) if ks is not None else k
    vs = vs.view(-1, *vs.shape[2:]) if vs is not None else v
    return k, v, ks, vs, codes, groups, page


def _k_split(path: str, codes: tuple[int, int], k_group: int) -> bool:
    """K_SPLIT constexpr of the "fold" path: a group-scaled K read as one slice per group (groups of 16+, a power
    of two); narrower groups are dequantized before the dot."""
    if path not in QUANT_PATHS:
        raise ValueError(f"quant_path {path!r} is not one of {QUANT_PATHS}")
    return codes[0] == 2 and k_group >= 16 and k_group & (k_group - 1) == 0


def _fresh_kv(q: torch.Tensor, k_new, v_new, cache: KVCache | None, meta):
    """(FRESH, k_new, v_new): whether chunks read their own K/V from ``k_new``/``v_new`` (checked ``[T, Hkv, D]``,
    head_dim made contiguous), and the tensors the kernel gets (q, never read, when not FRESH)."""
    if cache is None or k_new is None or meta.kv_from_cache or meta.max_query_len <= 1:
        return False, q, q
    if v_new is None:
        raise ValueError("paged_attention got k_new without v_new; pass both (or neither, to read the cache)")
    num_kv_heads = cache.k.shape[2]
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if x.dim() != 3 or x.shape[0] < q.shape[0] or x.shape[1:] != (num_kv_heads, q.shape[2]):
            raise ValueError(f"{name} must be [num_tokens >= {q.shape[0]}, {num_kv_heads}, {q.shape[2]}] (the "
                             f"step's K/V), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must hold the step's K/V in a float dtype, got {x.dtype}")
    contiguous = lambda x: x if x.stride(-1) == 1 else x.contiguous()  # noqa: E731
    return True, contiguous(k_new), contiguous(v_new)


def _check_order(order: torch.Tensor, num_seqs: int, device: torch.device) -> None:
    if order.shape != (num_seqs,) or order.dtype != torch.int32 or order.device != device:
        raise ValueError(f"meta.decode_order must be int32 [{num_seqs}] on {device} (a permutation of the rows), "
                         f"got {order.dtype} {tuple(order.shape)} on {order.device}")


def _launch_plan(q, k, v, ks, vs, codes, groups, fresh: bool, config: AttentionConfig | None, meta) -> tuple:
    """(choice, fp16-path constexprs, K_SPLIT, (block_q, q tiles, head_dim pad, splits pad)) of this batch.
    Every layer of a step shares it, so it is computed once per step (``meta.launch_choices``): a new input of the
    choice belongs in the key."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    shape = (fresh, group, num_kv_heads, head_dim, max(k.element_size(), v.element_size()),
             codes[0] == SCALE_CODES["group"], sm_count(q.device) if q.is_cuda else 0, config)
    key = (shape, q.dtype, q.device, k.dtype, v.dtype, codes, groups[0], ks.dtype, ks.stride(), vs.dtype, vs.stride())
    plan = meta.launch_choices.get(key)
    if plan is None:
        choice = batch_choice(meta.max_query_len, meta.max_seq_len, meta.seq_lens.shape[0], meta.query_lens_cpu,
                              meta.seq_lens_cpu, *shape)
        path = choice.config.quant_path or DEFAULT_QUANT_PATH  # one-byte decode-shaped tiles carry their own
        # nothing read from the cache: no fp16 conversion path either (the kernel is the bf16 cache's)
        narrow = narrow_constexprs(path if choice.cached else "fold", q, k, v, ks, vs, codes, groups[0], head_dim)
        k_split = _k_split(path, codes, groups[0])
        block_q = choice.config.block_m // group
        tiles = (block_q, -(-max(meta.max_query_len, 1) // block_q), triton.next_power_of_2(head_dim),
                 triton.next_power_of_2(choice.splits))
        if tiles[1] == 1 and meta.decode_order is not None:
            _check_order(meta.decode_order, meta.seq_lens.shape[0], q.device)  # once per step, not per layer
        plan = meta.launch_choices[key] = (choice, narrow, k_split, tiles)
    return plan


def paged_attention(q: torch.Tensor, k_new: torch.Tensor | None, v_new: torch.Tensor | None,
                    cache: KVCache | None, meta, scale: float, layout: KVLayout | None = None,
                    config: AttentionConfig | None = None) -> torch.Tensor:
    """Triton twin of ``paged_attention_reference``: ``q [T, Hq, D]`` -> ``[T, Hq, D]``.

    Reads the paged ``cache`` through ``meta.block_tables`` (or ``k_new``/``v_new`` when ``cache`` is
    None), chunks' own positions from ``k_new``/``v_new`` (see the module docstring). Grid and split count
    come from ``meta.max_query_len`` / ``meta.max_seq_len``: no host sync. Rows of tokens past
    ``query_start_loc[-1]`` are left unwritten, as in the reference.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    k, v, ks, vs, codes, groups, page = _layout_args(cache, layout, k_new, v_new)
    fresh, kn, vn = _fresh_kv(q, k_new, v_new, cache, meta)
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    num_seqs = meta.seq_lens.shape[0]
    choice, narrow, k_split, (block_q, num_q_tiles, head_dim_pad, splits_pad) = _launch_plan(
        q, k, v, ks, vs, codes, groups, fresh, config, meta)
    cfg, splits = choice.config, choice.splits
    scale_strides = (ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1))
    ks = ks.reshape(-1).view(torch.int32) if narrow["KS_HALVES"] else ks
    vs = vs.reshape(-1).view(torch.int32) if narrow["VS_HALVES"] else vs
    out = torch.empty(num_tokens, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    ws_acc = ws_ml = out
    if splits > 1:
        ws_acc = torch.empty(num_tokens * num_q_heads * splits, head_dim_pad, dtype=torch.float32, device=q.device)
        ws_ml = torch.empty(num_tokens * num_q_heads * splits, 2, dtype=torch.float32, device=q.device)
    heads_first = num_q_tiles == 1 and (DECODE_HEADS_FIRST if cfg.heads_first is None else cfg.heads_first)
    ordered = num_q_tiles == 1 and meta.decode_order is not None  # checked by _launch_plan
    # an ordered grid puts the KV heads on axis 0 whatever cfg.heads_first says: all heads of the longest first
    heads_first = heads_first or ordered
    block_tables = meta.block_tables if cache is not None else meta.seq_lens
    stride_bt = block_tables.stride(0) if block_tables.dim() == 2 else 0
    grid = (num_kv_heads, num_seqs, splits) if heads_first else (num_seqs * num_q_tiles, num_kv_heads, splits)
    paged_attention_kernel[grid](
        q, k, v, ks, vs, kn, vn, out, ws_acc, ws_ml, meta.query_start_loc, meta.seq_lens, block_tables,
        meta.decode_order if ordered else meta.seq_lens,  # the order pointer: unread unless ORDERED
        scale * LOG2E, 1.0 if narrow["NARROW"] else scale * LOG2E,  # fp16 path: q is pre-scaled
        num_q_tiles, splits, num_q_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *scale_strides, kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), out.stride(0), out.stride(1),
        stride_bt, GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.block_m,
        BLOCK_Q=block_q, BLOCK_N=cfg.block_n, PAGE_SIZE=page, PAGED=cache is not None, FRESH=fresh,
        CACHED=choice.cached, K_SCALE=codes[0], V_SCALE=codes[1], K_GROUP=groups[0], V_GROUP=groups[1],
        SPLIT=splits > 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", K_SPLIT=k_split, **narrow,
        HEADS_FIRST=heads_first, ORDERED=ordered, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        merge_splits_kernel[(num_tokens, num_q_heads)](
            ws_acc, ws_ml, out, splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, SPLITS_PAD=splits_pad,
            num_warps=4)
    return out
