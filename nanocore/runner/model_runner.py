"""ModelRunner: owns the model and the paged KV cache; turns one scheduled batch into sampled tokens.

Per step: build positions / slot mapping / block tables / cu_seqlens with vectorised numpy ops (one
pinned host->device copy for all of them), run the model, compute logits only for sequences that sample
(a prefill chunk that does not reach the end of its prompt samples nothing), and sample on the device.
``launch`` / ``launch_decode`` only queue work, so the engine can overlap it with host work.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from dataclasses import dataclass

import numpy as np
import torch

from nanocore.config import EngineConfig
from nanocore.runner.cuda_graphs import capture_graphs
from nanocore.runner.host_transfer import HostCopy, upload
from nanocore.runner.kv_sizing import choose_num_kv_blocks, kv_bytes_per_block
from nanocore.runner.sampling_inputs import build_sampling_tensors
from nanocore.interfaces import KVCodec
from nanocore.kernels.attention_config import decode_order_mode, longest_first
from nanocore.layers.attention import AttentionMetadata
from nanocore.layers.sampler import Sampler, SamplerOutput, SamplingTensors

logger = logging.getLogger("nanocore")


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor | None  # rows of the hidden states that produce logits (None: every row)
    sample_rows: list[int]  # batch indices of the sequences that sample this step


@dataclass
class StepResult:
    seqs: list[Sequence]  # the sequences that sampled, in order
    token_ids: list[int]
    #: per sampled sequence: (token ids, logprobs, rank of the sampled token); first id is the sampled one
    logprobs: list[tuple[list[int], list[float], int]] | None = None


class PendingSample:
    """A step's sampling queued on the device; ``result()`` waits for the sampled ids (pinned copy)."""

    def __init__(self, seqs: list[Sequence], out: SamplerOutput | None = None):
        self.seqs, self.out = seqs, out
        self.host_ids = HostCopy(out.token_ids) if out is not None else None
        # logprobs too: a pageable copy would wait for the look-ahead forward queued after this step
        self.host_logprobs = None if out is None or out.logprobs is None else tuple(
            HostCopy(t) for t in (out.logprob_token_ids, out.logprobs, out.sampled_ranks))

    @property
    def token_ids(self) -> torch.Tensor:
        """The sampled ids on the device, one per sequence: the next look-ahead step's input ids."""
        return self.out.token_ids

    def result(self) -> StepResult:
        if self.out is None:  # nothing sampled, or a tensor-parallel worker (rank 0 samples)
            return StepResult(self.seqs, [])
        result = StepResult(self.seqs, self.host_ids.tolist())
        if self.host_logprobs is not None:
            ids, lps, ranks = (copy.tolist() for copy in self.host_logprobs)
            result.logprobs = [
                (ids[i][:1 + (s.sampling_params.logprobs or 0)], lps[i][:1 + (s.sampling_params.logprobs or 0)], ranks[i])
                for i, s in enumerate(self.seqs)]
        return result


def block_table_array(tables: list[list[int]], width: int = 0) -> np.ndarray:
    """``[len(tables), max(longest, width)]`` int32, zero-padded: one flat copy and one masked store."""
    lens = np.array([len(t) for t in tables], dtype=np.int64)
    out = np.zeros((len(tables), max(int(lens.max()), width)), dtype=np.int32)
    out[np.arange(out.shape[1]) < lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int32, int(lens.sum()))
    return out


class ModelRunner:
    #: False on tensor/expert-parallel workers: they run every forward (its collectives need them); rank 0 samples
    samples = True

    def __init__(self, config: EngineConfig, loaded, device: torch.device, codec: KVCodec, max_model_len: int):
        """``loaded``: the LoadedModel (model, dtype, EOS ids) of this rank."""
        self.model = model = loaded.model
        self.device = device
        self.dtype = dtype = loaded.dtype
        self.codec = codec
        self.block_size = config.block_size
        self.decode_order = decode_order_mode(device.type)  # read once: the warm-up and the graphs follow it
        self.eos_token_ids = list(loaded.eos_token_ids or [])
        kv_cache_spec = model.kv_cache_spec
        num_layers, num_kv_heads, head_dim = kv_cache_spec
        self.bytes_per_block = bytes_per_block = kv_bytes_per_block(codec, kv_cache_spec, dtype, self.block_size)
        self.num_blocks = choose_num_kv_blocks(config, model, max_model_len, bytes_per_block, device)
        logger.info("KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB, codec %r)", self.num_blocks,
                    self.block_size, self.num_blocks * self.block_size, self.num_blocks * bytes_per_block / 2**30,
                    codec.name)
        self.kv_caches = [codec.allocate(self.num_blocks, self.block_size, num_kv_heads, head_dim, dtype, device)
                          for _ in range(num_layers)]
        generator = torch.Generator(device=device)
        generator.manual_seed(config.seed)
        self.sampler = Sampler(generator)
        self.max_blocks_per_seq = -(-max_model_len // self.block_size)
        self._last_block_tables: tuple[list, list[int], np.ndarray] = ([], [], np.zeros((0, 0), dtype=np.int32))
        self._sampling_key: tuple[Sequence, ...] | None = None  # the batch that _sampling_cache was built for
        self._sampling_cache: tuple[SamplingTensors, list] | None = None
        if device.type == "cuda" and config.kernel_warmup:  # before graph capture: eager steps' kernels too
            from nanocore.runner.warmup import ServingLimits, run_warmup
            run_warmup(self, ServingLimits(config.max_num_batched_tokens, config.max_num_seqs, max_model_len))
        self.decode_graphs, self.mixed_graphs = capture_graphs(config, model, self.kv_caches, codec, max_model_len,
                                                               device, dtype, self.decode_order)

    @property
    def capacity_tokens(self) -> int:
        """KV-cache capacity in tokens (all sequences together)."""
        return self.num_blocks * self.block_size

    # ---- inputs --------------------------------------------------------------------------
    def prepare(self, seqs: list[Sequence], num_tokens: list[int], all_logits: bool = False) -> StepInputs:
        """Step tensors from per-sequence ranges ``[num_computed, num_computed + n)``; no per-token loops."""
        num_seqs = len(seqs)
        starts_list = [s.num_computed_tokens for s in seqs]
        starts = np.array(starts_list, dtype=np.int64)
        query_lens = np.asarray(num_tokens, dtype=np.int64)
        seq_lens = starts + query_lens
        cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=cu_seqlens[1:])
        total = int(cu_seqlens[-1])
        input_ids = np.fromiter(itertools.chain.from_iterable(  # slices only: workers ship a token window
            s.token_ids[a:b] for s, a, b in zip(seqs, starts_list, seq_lens.tolist())), np.int64, total)
        seq_index = np.repeat(np.arange(num_seqs), query_lens)
        positions = np.arange(total, dtype=np.int64) - np.repeat(cu_seqlens[:-1] - starts, query_lens)
        if all_logits:
            sample_rows = list(range(num_seqs))
            logits_indices = np.arange(total)
        else:
            samples = seq_lens == np.array([s.num_tokens for s in seqs], dtype=np.int64)
            sample_rows = np.flatnonzero(samples).tolist()
            logits_indices = cu_seqlens[1:][samples] - 1
        pos, meta, (ids, logits_rows) = self._device_inputs(
            seqs, seq_index, positions, cu_seqlens, seq_lens, query_lens.tolist(), [input_ids, logits_indices])
        return StepInputs(ids, pos, meta, logits_rows, sample_rows)

    def prepare_decode(self, seqs: list[Sequence], token_ids: torch.Tensor, rows: list[int] | None) -> StepInputs:
        """Inputs of a look-ahead decode step: each sequence's next position (``num_tokens``: its newest token
        is still on the device) fed by ``token_ids[rows]`` (all rows when None), the last step's samples."""
        n = len(seqs)
        positions = np.fromiter([s.num_tokens for s in seqs], np.int64, n)
        extra = [] if rows is None else [np.asarray(rows, dtype=np.int64)]
        pos, meta, picked = self._device_inputs(seqs, np.arange(n), positions, np.arange(n + 1), positions + 1,
                                                [1] * n, extra)
        input_ids = token_ids if rows is None else token_ids.index_select(0, picked[0])
        return StepInputs(input_ids, pos, meta, None, list(range(n)))

    def _device_inputs(self, seqs: list[Sequence], seq_index: np.ndarray, positions: np.ndarray,
                       cu_seqlens: np.ndarray, seq_lens: np.ndarray, query_lens_cpu: list[int],
                       extra: list[np.ndarray]) -> tuple[torch.Tensor, AttentionMetadata, list[torch.Tensor]]:
        """Positions and attention metadata on the device (slots from the block tables), plus ``extra`` index
        arrays, in one pinned upload; the int32 tensors are converted on the device."""
        bs = self.block_size
        block_tables = self._block_tables([s.block_table for s in seqs])
        slot_mapping = block_tables[seq_index, positions // bs].astype(np.int64) * bs + positions % bs
        order = None
        if max(query_lens_cpu) <= 1 and self.decode_order == "longest_first":
            order = longest_first(seq_lens)
        parts = [positions, slot_mapping, cu_seqlens, seq_lens, block_tables.ravel(), *extra]
        parts += [order] if order is not None else []
        on_device = upload(np.concatenate(parts, dtype=np.int64), self.device).split([len(a) for a in parts])
        pos, slots, cu, lens, tables = on_device[:5]
        seq_lens_cpu = seq_lens.tolist()
        meta = AttentionMetadata(
            slot_mapping=slots, query_start_loc=cu.int(), seq_lens=lens.int(),
            block_tables=tables.int().view(block_tables.shape),
            max_query_len=max(query_lens_cpu), max_seq_len=max(seq_lens_cpu),
            kv_caches=self.kv_caches, codec=self.codec, query_lens_cpu=query_lens_cpu, seq_lens_cpu=seq_lens_cpu,
            decode_order=on_device[-1].int() if order is not None else None,
        )
        return pos, meta, list(on_device[5:5 + len(extra)])

    def _block_tables(self, tables: list[list[int]]) -> np.ndarray:
        """``block_table_array(tables)``, updated in place from the last step's when the rows hold the same
        list objects (BlockManager only grows a table in place; anything else assigns a new list)."""
        lens = list(map(len, tables))
        last_tables, last_lens, array = self._last_block_tables
        if (len(tables) == len(last_tables) and max(lens) <= array.shape[1]
                and all(map(operator.is_, tables, last_tables))):
            for row in [i for i, (a, b) in enumerate(zip(lens, last_lens)) if a != b]:  # decodes: a few rows grew
                array[row, last_lens[row]:lens[row]] = tables[row][last_lens[row]:]
        else:
            array = block_table_array(tables, self.max_blocks_per_seq)  # room to grow without a rebuild
        self._last_block_tables = (tables, lens, array)
        return array[:, :max(lens)].copy()  # a copy: the cached array changes next step

    def sampling_tensors(self, seqs: list[Sequence]) -> SamplingTensors:
        """Per-row sampling parameters as device tensors; optional masks only when some row uses them.

        The per-row part is rebuilt only when the batch's sequences change (decode steps usually keep
        them); only the min_tokens bans, which depend on progress, are recomputed every step.
        """
        key = tuple(seqs)
        if key != self._sampling_key:
            self._sampling_key = key
            self._sampling_cache = build_sampling_tensors(seqs, self.eos_token_ids, self.device)
        base, min_tokens_rows = self._sampling_cache
        banned_rows, banned_ids = [], []
        for row, seq, ids in min_tokens_rows:
            if seq.num_tokens - seq.num_prompt_tokens < seq.sampling_params.min_tokens:  # EOS / stop ids not allowed yet
                banned_rows += [row] * len(ids)
                banned_ids += ids
        if not banned_rows:
            return base
        rows, ids = upload(np.array([banned_rows, banned_ids], dtype=np.int64), self.device)
        return dataclasses.replace(base, banned=(rows, ids))

    # ---- execution -----------------------------------------------------------------------
    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        if self.decode_graphs is not None and self.decode_graphs.can_run(inputs.meta, inputs.meta.num_seqs):
            return self.decode_graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs.meta, inputs.input_ids.shape[0]):
            return self.mixed_graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        return self.model.forward(inputs.input_ids, inputs.positions, inputs.meta)

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_tokens: list[int]) -> StepResult:
        """Run one step of the scheduled batch and sample for the sequences that reach their end."""
        return self.launch(seqs, num_tokens).result()

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], num_tokens: list[int], hidden: torch.Tensor | None = None) -> PendingSample:
        """Forward, logits and sampling of one step, queued on the device; ``.result()`` waits for the ids.

        ``hidden``: the hidden states of this decode batch (one row per sequence) from a look-ahead
        ``launch_decode``; then only logits and sampling are queued.
        """
        if hidden is None:
            inputs = self.prepare(seqs, num_tokens)
            hidden = self._forward(inputs)
            sampled = [seqs[i] for i in inputs.sample_rows]
            if len(sampled) < len(seqs) or inputs.meta.max_query_len > 1:
                hidden = hidden[inputs.logits_indices]
        else:
            sampled = seqs
        if not sampled:
            return PendingSample([])
        logits = self.model.compute_logits(hidden)
        if not self.samples:
            return PendingSample(sampled)
        out = self.sampler(logits, self.sampling_tensors(sampled))
        return PendingSample(sampled, out)

    @torch.inference_mode()
    def launch_decode(self, seqs: list[Sequence], token_ids: torch.Tensor, rows: list[int] | None) -> torch.Tensor:
        """Queue the forward of the decode step after the one whose samples ``token_ids`` are still on the
        device (see ``prepare_decode``); returns its hidden states, one row per sequence."""
        return self._forward(self.prepare_decode(seqs, token_ids, rows))

    @torch.inference_mode()
    def prompt_logits(self, seq: Sequence, kv_from_cache: bool = False) -> torch.Tensor:
        """Logits ``[num_tokens, vocab]`` of a whole sequence whose blocks are allocated (teacher forcing).

        ``kv_from_cache``: the tokens attend to each other through the quantized cache (stored, then read back
        through the codec), so a perplexity measures the codec; False scores them as a prefill runs.
        """
        inputs = self.prepare([seq], [seq.num_tokens - seq.num_computed_tokens], all_logits=True)
        meta = dataclasses.replace(inputs.meta, kv_from_cache=kv_from_cache, launch_choices={})  # a fresh memo
        hidden = self.model.forward(inputs.input_ids, inputs.positions, meta)
        return self.model.compute_logits(hidden).float()  # evaluation scores in float32
