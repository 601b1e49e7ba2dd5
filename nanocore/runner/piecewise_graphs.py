"""Piecewise CUDA graphs for steps with prefill chunks (mixed and prefill steps).

A step of ``T`` tokens (``T`` up to the largest bucket) runs in the smallest token bucket ``Tb >= T``: the model's
forward is captured once per bucket as ``num_layers + 1`` graph segments, cut at every attention call. Between
segment replays attention runs eagerly on the step's real metadata (its grid, split count and causal layout
change every step, which a graph cannot hold): each segment ends by copying the layer's q/k/v into static
buffers, attention reads their first ``T`` rows and writes its output into a static buffer the next segment
reads. Padding rows (``T..Tb``) are token 0 at position 0; attention leaves their output rows as they were, so
they stay finite, and no padding row is stored to the cache (attention only reads the first ``T`` rows).
Pure decode steps keep ``DecodeGraphs`` (attention captured too). ``segmented_forward`` runs the same plumbing
eagerly (attention at the cut instead of after a replay), which is what the CPU tests compare against a plain
forward. ``EngineConfig.cuda_graph_mixed``, on by default with one GPU (H200, Qwen2.5-7B, decode_first chunk 128 at
a 32K prompt: the running decode's max ITL 64 -> 23 ms, docs/benchmarks.md).
"""
from __future__ import annotations

import logging

import torch

from nanocore.layers.attention import Attention, AttentionMetadata

logger = logging.getLogger("nanocore")


def step_token_limit(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int) -> int:
    """The most tokens one step can hold: no bucket past it (it could never run, yet would hold pool memory)."""
    return min(max_num_batched_tokens, max_num_seqs * max_model_len)


def mixed_buckets(max_num_batched_tokens: int, largest: int = 512) -> list[int]:
    """Token buckets: every 8 to 32, every 16 to 128, every 32 to 256, every 64 to ``largest`` (at most 25% padding
    past 64 tokens), capped by ``max_num_batched_tokens`` (always a bucket itself when smaller). Larger steps run
    eagerly, as in vLLM (capture sizes up to 512): on the H200 a 7B step of 1,025 tokens padded to a 1,280 bucket
    was 9% slower than eager (the GPU work hides the host's launches there; the padding does not)."""
    top = min(max_num_batched_tokens, largest)
    sizes = [8, 16, 24, 32] + list(range(48, 129, 16)) + list(range(160, 257, 32)) + list(range(320, largest + 1, 64))
    return sorted({s for s in sizes if s < top} | {top})


class SegmentBuffers:
    """Static q / k / v / attention-output storage shared by every layer and bucket: flat, so the first
    ``T * heads * head_dim`` elements are a contiguous ``[T, heads, head_dim]`` view for any layer's widths."""

    def __init__(self, attn_layers: list[Attention], max_tokens: int, dtype: torch.dtype, device: torch.device):
        q_width = max(a.num_heads * a.head_dim for a in attn_layers)
        kv_width = max(a.num_kv_heads * a.head_dim for a in attn_layers)
        zeros = lambda width: torch.zeros(max_tokens * width, dtype=dtype, device=device)  # noqa: E731
        self.q, self.k, self.v, self.out = zeros(q_width), zeros(kv_width), zeros(kv_width), zeros(q_width)

    @staticmethod
    def _rows(buf: torch.Tensor, n: int, heads: int, head_dim: int) -> torch.Tensor:
        return buf[:n * heads * head_dim].view(n, heads, head_dim)

    def views(self, layer: Attention, n: int) -> tuple[torch.Tensor, ...]:
        """``[n, heads, head_dim]`` views of q, k, v and out for ``layer``'s widths."""
        h, kvh, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        return (self._rows(self.q, n, h, d), self._rows(self.k, n, kvh, d), self._rows(self.v, n, kvh, d),
                self._rows(self.out, n, h, d))

    def stash(self, layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Copy a layer's q/k/v (``[Tb, heads, head_dim]``) in; returns the output rows the next segment reads."""
        q_rows, k_rows, v_rows, out = self.views(layer, q.shape[0])
        for rows, x in ((q_rows, q), (k_rows, k), (v_rows, v)):
            rows.copy_(x)
        return out.view(q.shape[0], -1)

    def attend(self, layer: Attention, n: int, meta: AttentionMetadata, step_views: dict) -> None:
        """The layer's KV store and attention for the step's ``n`` rows, into ``out``; ``step_views`` memoises the
        views per attention width for the step (built once per step, not per layer)."""
        key = (layer.num_heads, layer.num_kv_heads, layer.head_dim)
        if key not in step_views:
            step_views[key] = self.views(layer, n)
        q, k, v, out = step_views[key]
        out.copy_(layer.attend(q, k, v, meta))


class PiecewiseGraphs:
    """Per-bucket segment graphs of the model's forward (see the module docstring)."""

    def __init__(self, model, max_step_tokens: int, device: torch.device, dtype: torch.dtype, capture: bool = True):
        """``max_step_tokens``: the most tokens a step can hold (``step_token_limit``). The cache is not needed
        here: the captured segments never reach attention, which runs on each step's own metadata."""
        self.model = model
        self.buckets = mixed_buckets(max_step_tokens)
        top = self.buckets[-1]
        self.buffers = SegmentBuffers([m for m in model.modules() if isinstance(m, Attention)], top, dtype, device)
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.segments: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.layers: dict[int, list[Attention]] = {}  # attention layer after each segment but the last
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all(device)

    def bucket(self, num_tokens: int) -> int:
        return next(b for b in self.buckets if b >= num_tokens)

    def can_run(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """Steps with a chunk of 2+ tokens within the buckets; never the eval path (``kv_from_cache``)."""
        return not meta.is_decode_only and num_tokens <= self.buckets[-1] and not meta.kv_from_cache

    def _load_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[int, int]:
        n = input_ids.shape[0]
        bs = self.bucket(n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.input_ids[n:bs].zero_()
        self.positions[n:bs].zero_()
        return n, bs

    @staticmethod
    def _capture_meta(bs: int, device: torch.device) -> AttentionMetadata:
        """Metadata the segments see: one chunk of ``bs`` tokens and no cache (attention is cut out)."""
        return AttentionMetadata.for_prefill([bs], device)

    @torch.inference_mode()
    def _capture_all(self, device: torch.device) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        for bs in reversed(self.buckets):  # largest first: smaller buckets reuse its pool memory
            self.segmented_forward(self.input_ids[:bs], self.positions[:bs], None)  # compile outside capture
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()  # as torch.cuda.graph: cached blocks cannot be released while capturing
            self.segments[bs], self.layers[bs] = self._capture_bucket(bs, pool, stream, device)
        torch.cuda.synchronize(device)
        logger.info("captured piecewise CUDA graphs for steps with prefill chunks: %d token buckets %s, %d segments "
                    "each", len(self.buckets), self.buckets, len(self.segments[self.buckets[-1]]))

    def _capture_bucket(self, bs: int, pool, stream: torch.cuda.Stream, device: torch.device):
        meta = self._capture_meta(bs, device)
        graphs, layers = [torch.cuda.CUDAGraph()], []

        def cut(layer, q, k, v):
            out = self.buffers.stash(layer, q, k, v)
            graphs[-1].capture_end()
            layers.append(layer)
            graphs.append(torch.cuda.CUDAGraph())
            graphs[-1].capture_begin(pool=pool)
            return out

        meta.segment_break = cut
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            graphs[0].capture_begin(pool=pool)
            try:
                self.outputs[bs] = self.model.forward(self.input_ids[:bs], self.positions[:bs], meta)
            finally:  # as torch.cuda.graph's exit: never leave the stream capturing (a failure must surface as itself)
                graphs[-1].capture_end()
        torch.cuda.current_stream(device).wait_stream(stream)
        return graphs, layers

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states ``[T, H]`` of a step with prefill chunks: segment replays, eager attention between."""
        n, bs = self._load_inputs(input_ids, positions)
        segments, layers = self.segments[bs], self.layers[bs]
        step_views = {}
        for i, graph in enumerate(segments):
            graph.replay()
            if i < len(layers):
                self.buffers.attend(layers[i], n, meta, step_views)
        return self.outputs[bs][:n]

    def segmented_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                          meta: AttentionMetadata | None) -> torch.Tensor:
        """The same plumbing without graphs (padding to the bucket, static buffers, attention on the first ``T``
        rows of the step's ``meta``), attention at each cut; ``meta`` None skips attention (pre-capture warm-up)."""
        n, bs = self._load_inputs(input_ids, positions)
        step_views = {}

        def cut(layer, q, k, v):
            out = self.buffers.stash(layer, q, k, v)
            if meta is not None:
                self.buffers.attend(layer, n, meta, step_views)
            return out

        seg_meta = self._capture_meta(bs, input_ids.device)
        seg_meta.segment_break = cut
        return self.model.forward(self.input_ids[:bs], self.positions[:bs], seg_meta)[:n]
