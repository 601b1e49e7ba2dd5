"""Step inputs from a plan: positions, slot mapping, block tables and cu_seqlens, built with vectorised numpy ops
and uploaded in one pinned host->device copy."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from nanocore.kernels.attention_config import longest_first
from nanocore.layers.attention import AttentionMetadata
from nanocore.runner.host_transfer import upload
from nanocore.runner.prompt_logprobs import PromptRows, prompt_positions
from nanocore.runner.step_plan import AheadPlan, StepPlan


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor | None  # rows of the hidden states that produce logits (None: every row)
    sample_rows: list[int]  # batch indices of the rows that sample this step
    prompt: PromptRows | None = None  # prompt positions some rows score this step


def block_table_array(tables: list[list[int]], width: int = 0) -> np.ndarray:
    """``[len(tables), max(longest, width)]`` int32, zero-padded: one flat copy and one masked store."""
    lens = np.array([len(t) for t in tables], dtype=np.int64)
    out = np.zeros((len(tables), max(int(lens.max()), width)), dtype=np.int32)
    out[np.arange(out.shape[1]) < lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int32, int(lens.sum()))
    return out


class BlockTables:
    """The step's block-table array, updated in place from the previous step's when the rows are the same
    sequences: a row whose table grew gets its new blocks; another batch, or a sequence reset since, rebuilds."""

    def __init__(self, max_blocks_per_seq: int):
        self.max_blocks_per_seq = max_blocks_per_seq
        self._key: tuple[int, ...] = ()
        self._lens: list[int] = []
        self._array = np.zeros((0, 0), dtype=np.int32)

    def forget(self, seq_ids: list[int]) -> None:
        """Sequences whose tables were freed or cut back: their cached rows may hold other blocks now."""
        if not set(seq_ids).isdisjoint(self._key):
            self._key = ()

    def build(self, seq_ids: tuple[int, ...], tables: list[list[int]]) -> np.ndarray:
        lens = list(map(len, tables))
        array, last_lens = self._array, self._lens
        if seq_ids == self._key and max(lens) <= array.shape[1]:
            for row in [i for i, (a, b) in enumerate(zip(lens, last_lens)) if a != b]:  # decodes: a few rows grew
                array[row, last_lens[row]:lens[row]] = tables[row][last_lens[row]:]
        else:
            array = block_table_array(tables, self.max_blocks_per_seq)  # room to grow without a rebuild
        self._key, self._lens, self._array = seq_ids, lens, array
        return array[:, :max(lens)].copy()  # a copy: the cached array changes next step


class InputBuilder:
    """Turns plan rows into the model's inputs on ``device``."""

    def __init__(self, block_size: int, max_blocks_per_seq: int, device: torch.device, decode_order: str):
        self.block_size, self.device, self.decode_order = block_size, device, decode_order
        self.tables = BlockTables(max_blocks_per_seq)

    def prepare(self, plan: StepPlan, kv_caches, codec, all_logits: bool = False) -> StepInputs:
        """Inputs of rows computing ``[start, start + len(token_ids))`` each; no per-token loops."""
        rows = plan.rows
        num_seqs = len(rows)
        starts = np.array([r.start for r in rows], dtype=np.int64)
        query_lens = np.array([len(r.token_ids) for r in rows], dtype=np.int64)
        seq_lens = starts + query_lens
        cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=cu_seqlens[1:])
        total = int(cu_seqlens[-1])
        input_ids = np.fromiter(itertools.chain.from_iterable(r.token_ids for r in rows), np.int64, total)
        seq_index = np.repeat(np.arange(num_seqs), query_lens)
        positions = np.arange(total, dtype=np.int64) - np.repeat(cu_seqlens[:-1] - starts, query_lens)
        if all_logits:
            sample_rows, logits_indices = list(range(num_seqs)), np.arange(total)
        else:
            samples = np.fromiter((r.samples for r in rows), bool, num_seqs)
            sample_rows = np.flatnonzero(samples).tolist()
            logits_indices = cu_seqlens[1:][samples] - 1
        scoring, prompt_indices, targets = prompt_positions(rows, cu_seqlens) if not all_logits else ([], [], [])
        tables = self._tables(plan, cached=not all_logits)
        pos, meta, (ids, logits_rows, *prompt) = self._device_inputs(
            tables, seq_index, positions, cu_seqlens, seq_lens, query_lens.tolist(),
            [input_ids, logits_indices, *([prompt_indices, targets] if scoring else [])], kv_caches, codec)
        inputs = StepInputs(ids, pos, meta, logits_rows, sample_rows)
        if scoring:
            inputs.prompt = PromptRows(scoring, *prompt, max(rows[i].num_prompt_logprobs for i in scoring))
        return inputs

    def prepare_ahead(self, ahead: AheadPlan, token_ids: torch.Tensor, kv_caches, codec) -> StepInputs:
        """Inputs of a look-ahead decode step, fed by ``token_ids`` (the previous step's samples, on the device)."""
        n = len(ahead.seq_ids)
        positions = np.asarray(ahead.positions, dtype=np.int64)
        extra = [] if ahead.source_rows is None else [np.asarray(ahead.source_rows, dtype=np.int64)]
        tables = self.tables.build(tuple(ahead.seq_ids), ahead.block_tables)
        pos, meta, picked = self._device_inputs(tables, np.arange(n), positions, np.arange(n + 1), positions + 1,
                                                [1] * n, extra, kv_caches, codec)
        input_ids = token_ids if ahead.source_rows is None else token_ids.index_select(0, picked[0])
        return StepInputs(input_ids, pos, meta, None, list(range(n)))

    def _tables(self, plan: StepPlan, cached: bool) -> np.ndarray:
        tables = [r.block_table for r in plan.rows]
        if not cached:  # evaluation rows are not sequences of the engine: never keep them
            return block_table_array(tables)
        return self.tables.build(plan.seq_ids(), tables)

    def _device_inputs(self, block_tables: np.ndarray, seq_index: np.ndarray, positions: np.ndarray,
                       cu_seqlens: np.ndarray, seq_lens: np.ndarray, query_lens_cpu: list[int],
                       extra: list[np.ndarray], kv_caches, codec):
        """Positions and attention metadata on the device (slots from the block tables), plus ``extra`` index
        arrays, in one pinned upload; the int32 tensors are converted on the device."""
        bs = self.block_size
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
            kv_caches=kv_caches, codec=codec, query_lens_cpu=query_lens_cpu, seq_lens_cpu=seq_lens_cpu,
            decode_order=on_device[-1].int() if order is not None else None,
        )
        return pos, meta, list(on_device[5:5 + len(extra)])
