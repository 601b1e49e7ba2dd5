"""CUDA graphs for decode steps: one graph per batch-size bucket and context tier, replayed on persistent buffers
(steps with prefill chunks: ``piecewise_graphs``; ``capture_graphs`` builds both for the ModelRunner).

Every decode batch of up to ``max_num_seqs`` sequences runs in the smallest captured bucket that holds
it (buckets 1, 2, 4, 8, then every multiple of 8 up to ``max_num_seqs``: no gaps); padding rows store
to slot -1 and attend over zero keys. The block-table width comes from ``max_model_len``. Attention's launch
choice (tile, KV splits) is frozen at capture by ``max_seq_len``: each bucket is captured at ``max_model_len`` and
at the context tiers below it where that choice differs (``context_tiers``), and a step replays the smallest tier
that holds its longest context. Logits and sampling run outside the graph (they depend on the sampling parameters).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from nanocore.runner.piecewise_graphs import PiecewiseGraphs, step_token_limit
from nanocore.runner.warmup import attention_shape
from nanocore.runner.warmup_plan import AttentionShape, WarmupBatch, choice_of
from nanocore.kernels.device import sm_count
from nanocore.layers.attention import AttentionMetadata

if TYPE_CHECKING:
    from nanocore.config import EngineConfig
    from nanocore.interfaces import KVCodec

logger = logging.getLogger("nanocore")


def decode_buckets(max_num_seqs: int) -> list[int]:
    """Captured batch sizes: small powers of two, then steps of 8, always ending at max_num_seqs."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return sorted(set(sizes + [max_num_seqs]))


#: Context bounds below ``max_model_len`` at which a bucket may get its own graph (powers of 4). With one graph at
#: ``max_model_len`` a 128-token batch-1 decode at ``max_model_len`` 40,960 ran the 64-split tile of 40K contexts.
CONTEXT_TIERS = (256, 1024, 4096, 16384)


def context_tiers(bs: int, max_model_len: int, shape: AttentionShape | None, sms: int) -> list[int]:
    """The context bounds captured for bucket ``bs``, ascending, ending at ``max_model_len``: a ``CONTEXT_TIERS``
    bound below it only where the attention choice of ``bs`` decodes at that length differs from the next larger
    bound's (else its graph would be the same). ``shape`` None: ``max_model_len`` only."""
    tiers = [max_model_len]
    if shape is None:
        return tiers
    choice = lambda seq_len: choice_of(WarmupBatch((1,) * bs, (seq_len,) * bs), shape, sms)  # noqa: E731
    for bound in sorted((t for t in CONTEXT_TIERS if t < max_model_len), reverse=True):
        if choice(bound) != choice(tiers[0]):
            tiers.insert(0, bound)
    return tiers


class DecodeGraphs:
    def __init__(self, model, kv_caches, codec, max_num_seqs: int, max_model_len: int, block_size: int,
                 device: torch.device, decode_order: str, shape: AttentionShape | None = None):
        """``decode_order``: the runner's (``decode_order_mode``), no default, so graphs and steps cannot disagree;
        ``shape``: the model's attention shape, for the context tiers (None: one graph per bucket)."""
        self.model = model
        self.buckets = decode_buckets(max_num_seqs)
        self.max_model_len = max_model_len
        sms = sm_count(device) if device.type == "cuda" else 0
        self.tiers = {bs: context_tiers(bs, max_model_len, shape, sms) for bs in self.buckets}
        max_bs = self.buckets[-1]
        max_blocks = -(-max_model_len // block_size)
        zeros = lambda *shape, dtype: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        self.input_ids = zeros(max_bs, dtype=torch.int64)
        self.positions = zeros(max_bs, dtype=torch.int64)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=device)
        self.seq_lens = zeros(max_bs, dtype=torch.int32)
        self.block_tables = zeros(max_bs, max_blocks, dtype=torch.int32)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        # longest-first decode grids: the step's order, padded rows after it in their own order (a permutation)
        self.decode_order = self.query_start_loc[:max_bs].clone() if decode_order == "longest_first" else None
        self.kv_caches, self.codec = kv_caches, codec
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # keyed (bucket, context tier)
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._capture_all(device)

    def _meta(self, bs: int, tier: int | None = None) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], query_start_loc=self.query_start_loc[:bs + 1],
            seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs],
            max_query_len=1, max_seq_len=self.max_model_len if tier is None else tier, kv_caches=self.kv_caches,
            codec=self.codec,
            decode_order=self.decode_order[:bs] if self.decode_order is not None else None)

    @torch.inference_mode()
    def _capture_all(self, device: torch.device) -> None:
        pool = torch.cuda.graph_pool_handle()
        keys = [(bs, tier) for bs in reversed(self.buckets) for tier in reversed(self.tiers[bs])]
        for bs, tier in keys:  # largest first so smaller graphs reuse its memory pool
            args = (self.input_ids[:bs], self.positions[:bs], self._meta(bs, tier))
            self.model.forward(*args)  # warm-up: Triton autotuning / compilation outside capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs, tier] = self.model.forward(*args)
            self.graphs[bs, tier] = graph
        torch.cuda.synchronize(device)
        tiered = {bs: tiers[:-1] for bs, tiers in self.tiers.items() if len(tiers) > 1}
        logger.info("captured %d decode CUDA graphs (batch sizes %s; context tiers below max_model_len %d: %s)",
                    len(keys), self.buckets, self.max_model_len, tiered or "none")

    def graph_key(self, num_seqs: int, max_seq_len: int) -> tuple[int, int]:
        """(bucket, context tier) a decode step of ``num_seqs`` rows up to ``max_seq_len`` keys replays."""
        bs = next(b for b in self.buckets if b >= num_seqs)
        return bs, next(t for t in self.tiers[bs] if t >= max_seq_len)

    def can_run(self, meta: AttentionMetadata, num_seqs: int) -> bool:
        return meta.is_decode_only and num_seqs <= self.buckets[-1] and meta.max_seq_len <= self.max_model_len

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states ``[num_seqs, H]`` of a decode step, replayed in the smallest fitting bucket."""
        n = input_ids.shape[0]
        bs, tier = self.graph_key(n, meta.max_seq_len)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:bs].fill_(0)
        width = meta.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(meta.block_tables)
        if self.decode_order is not None:
            if meta.decode_order is None:
                raise RuntimeError("decode graphs were captured longest-first but the step has no decode_order")
            self.decode_order[:n].copy_(meta.decode_order)
            self.decode_order[n:bs].copy_(self.query_start_loc[n:bs])  # one token per row: 0, 1, 2, ...
        self.graphs[bs, tier].replay()
        return self.outputs[bs, tier][:n]


def capture_graphs(config: EngineConfig, model, kv_caches, codec: KVCodec, max_model_len: int, device: torch.device,
                   dtype: torch.dtype, decode_order: str):
    """(DecodeGraphs, PiecewiseGraphs) for a CUDA device unless eager; either may be None."""
    if device.type != "cuda" or config.enforce_eager:
        return None, None
    blocker = graph_blocker(model)
    if blocker:
        logger.warning("decode runs without CUDA graphs: %s", blocker)
        return None, None
    decode = DecodeGraphs(model, kv_caches, codec, config.max_num_seqs, max_model_len, config.block_size, device,
                          decode_order, attention_shape(model, codec, dtype))
    if not captures_mixed_graphs(config, model):
        return decode, None
    limit = step_token_limit(config.max_num_batched_tokens, config.max_num_seqs, max_model_len)
    try:
        return decode, PiecewiseGraphs(model, limit, device, dtype)
    except Exception as exc:  # a capture that fails leaves the engine on eager chunked steps
        logger.warning("piecewise CUDA graphs disabled, steps with prefill chunks run eagerly: capture failed "
                       "(%s: %s)", type(exc).__name__, exc)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return decode, None


def captures_mixed_graphs(config: EngineConfig, model: torch.nn.Module) -> bool:
    """Whether a CUDA engine captures piecewise graphs for steps with prefill chunks (KV sizing reserves their pool)."""
    wanted = config.cuda_graph_mixed
    if wanted is None:  # default: one GPU only (collectives inside the segments are not yet run on GPUs)
        wanted = config.tensor_parallel_size == 1 and config.expert_parallel_size == 1
    return wanted and not config.enforce_eager and graph_blocker(model) is None


def graph_blocker(model: torch.nn.Module) -> str | None:
    """Why the model cannot be captured in a CUDA graph (a step that synchronises with the host), or None."""
    for module in model.modules():
        executor = getattr(module, "executor", None)
        if executor is not None and not getattr(executor, "supports_cuda_graph", True):
            return (f"MoE executor {type(executor).__name__!r} synchronises with the host; choose one with "
                    f"supports_cuda_graph (e.g. moe_executor='triton_fused_moe') for graph-captured decode")
        reason = getattr(getattr(module, "prepare_finalize", None), "cuda_graph_blocker", None)
        if reason:
            return reason
    return None
