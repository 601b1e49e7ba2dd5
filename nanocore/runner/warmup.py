"""Kernel warm-up: before the engine reports ready, run one forward (and sampling) per batch of the warm-up plan
(``warmup_plan``), so every Triton kernel variant a serving step can select is compiled at start, not on the
first request that happens to select it (a compile there stalls every request in the batch).

The batches write no KV (slot -1) and read scratch block 0 for their cached positions (zeros at start, and
never handed out yet); their outputs are dropped. Their memory stays within the profile run's activation
budget (none is larger than a ``max_num_batched_tokens`` step), and the log line says how much it took.
"""
from __future__ import annotations

import logging
import time

import torch

from nanocore.runner.warmup_plan import AttentionShape, ServingLimits, WarmupBatch, warmup_plan
from nanocore.kernels.attention_config import longest_first
from nanocore.kernels.device import sm_count
from nanocore.layers.attention import Attention, AttentionMetadata
from nanocore.layers.sampler import Sampler, SamplingTensors

logger = logging.getLogger("nanocore")


def attention_shape(model: torch.nn.Module, codec, dtype: torch.dtype) -> AttentionShape:
    """This rank's attention shape and the codec's layout, read off the model's first attention layer."""
    attn = next(m for m in model.modules() if isinstance(m, Attention))
    layout = codec.layout(dtype)
    itemsize = max(layout.k_dtype.itemsize, layout.v_dtype.itemsize)
    return AttentionShape(attn.num_heads // attn.num_kv_heads, attn.num_kv_heads, attn.head_dim, itemsize,
                          layout.k_scale == "group")


def batch_inputs(batch: WarmupBatch, kv_caches, codec, block_size: int, device: torch.device, decode_order: str):
    """(input_ids, positions, metadata) of ``batch``: no KV stored, every page of every table is block 0;
    ``decode_order`` as the runner's (its decode steps' grid variant)."""
    q, s = list(batch.query_lens), list(batch.seq_lens)
    starts = [0]
    for n in q:
        starts.append(starts[-1] + n)
    positions = torch.cat([torch.arange(seq - n, seq) for n, seq in zip(q, s)]).to(device)
    meta = AttentionMetadata(
        slot_mapping=torch.full((batch.num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(s, dtype=torch.int32, device=device),
        block_tables=torch.zeros(len(q), -(-max(s) // block_size), dtype=torch.int32, device=device),
        max_query_len=max(q), max_seq_len=max(s), kv_caches=kv_caches, codec=codec,
        query_lens_cpu=q, seq_lens_cpu=s)
    if max(q) <= 1 and decode_order == "longest_first":
        meta.decode_order = torch.as_tensor(longest_first(s), dtype=torch.int32, device=device)
    return torch.zeros(batch.num_tokens, dtype=torch.int64, device=device), positions, meta


@torch.inference_mode()
def run_warmup(runner, limits: ServingLimits) -> list[WarmupBatch]:
    """Forward, logits and fused sampling of every planned batch on ``runner``'s model; logs time and memory."""
    device = runner.device
    cuda = device.type == "cuda"  # CPU (tests): the same batches through the torch paths, nothing to compile
    shape = attention_shape(runner.model, runner.codec, runner.dtype)
    plan = warmup_plan(limits, shape, sm_count(device) if cuda else 0)
    sampler = Sampler(torch.Generator(device=device))  # its own RNG: the engine's sampling stays as seeded
    if cuda:
        torch.cuda.synchronize(device)
        allocated = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for batch in plan:
        input_ids, positions, meta = batch_inputs(batch, runner.kv_caches, runner.codec, runner.block_size, device,
                                                  runner.decode_order)
        hidden = runner.model.forward(input_ids, positions, meta)
        logits = runner.model.compute_logits(hidden[meta.query_start_loc[1:].long() - 1])
        if runner.samples:
            n = logits.shape[0]
            sampler(logits, SamplingTensors(torch.ones(n, device=device), None, None, None, [None] * n,
                                            all_greedy=False, any_greedy=False))
    if cuda:
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - allocated if cuda else 0
    logger.info("kernel warm-up: %d batches (max %d tokens) in %.1f s, peak %.0f MiB above the KV cache and "
                "weights (within the profiled activation budget)", len(plan), max(b.num_tokens for b in plan),
                time.perf_counter() - start, peak / 2**20)
    return plan
