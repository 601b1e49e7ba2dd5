"""The sampler's per-row inputs of a step, built on the host and uploaded in one copy."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from nanocore.layers.sampler import SamplingTensors
from nanocore.runner.host_transfer import upload
from nanocore.runner.step_plan import ScheduledRow, seq_id_of


class SamplingInputs:
    """Sampling tensors per batch of rows, and each seeded sequence's random stream (kept until it finishes).

    The per-row part is rebuilt only when the batch's sequences change (decode steps usually keep them); only the
    min_tokens bans, which depend on progress, and the structured-output masks are new every step.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.generators: dict[int, torch.Generator] = {}  # seq id -> its own stream, when seeded
        self._key: tuple[int, ...] | None = None
        self._base: SamplingTensors | None = None
        self._min_tokens_rows: list[int] = []

    def drop(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.generators.pop(seq_id, None)

    def tensors(self, rows: list[ScheduledRow], bitmask: torch.Tensor | None = None,
                bitmask_rows: list[int] | None = None) -> SamplingTensors:
        """``rows``: the step's sampling rows; ``bitmask``: the masks of ``rows[bitmask_rows[i]]`` (StepPlan)."""
        base = self._tensors(rows)
        if bitmask is None:
            return base
        if bitmask.shape[0] != len(bitmask_rows or ()):
            raise ValueError(f"malformed step plan: {bitmask.shape[0]} token bitmask rows for {bitmask_rows!r}")
        indices = upload(np.asarray(bitmask_rows, dtype=np.int64), self.device)
        return dataclasses.replace(base, token_bitmask=(upload(bitmask.numpy(), self.device), indices))

    def _tensors(self, rows: list[ScheduledRow]) -> SamplingTensors:
        key = tuple(map(seq_id_of, rows))
        if key != self._key:
            self._key = key
            self._base = self._build(rows)
            self._min_tokens_rows = [i for i, r in enumerate(rows) if r.sampling.min_tokens > 0]
        banned_rows, banned_ids = [], []
        for i in self._min_tokens_rows:
            row = rows[i]
            if row.num_output_tokens < row.sampling.min_tokens:  # EOS / stop ids not allowed yet
                ids = row.sampling.min_tokens_banned
                banned_rows += [i] * len(ids)
                banned_ids += ids
        if not banned_rows:
            return self._base
        banned = upload(np.array([banned_rows, banned_ids], dtype=np.int64), self.device)
        return dataclasses.replace(self._base, banned=(banned[0], banned[1]))

    def _generator(self, seq_id: int, seed: int) -> torch.Generator:
        generator = self.generators.get(seq_id)
        if generator is None:
            generator = self.generators[seq_id] = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        return generator

    def _build(self, rows: list[ScheduledRow]) -> SamplingTensors:
        """The per-row parameters in one packed upload."""
        params = [r.sampling for r in rows]
        temperatures = [p.temperature for p in params]
        packed = upload(np.array([temperatures, [p.top_k for p in params], [p.top_p for p in params],
                                  [p.min_p for p in params]], dtype=np.float64), self.device)  # float64: exact top_k
        wants_logprobs = [p.logprobs for p in params if p.logprobs is not None]
        return SamplingTensors(
            temperatures=packed[0].float(),
            top_k=packed[1].long() if any(p.top_k for p in params) else None,
            top_p=packed[2].float() if any(p.top_p < 1 for p in params) else None,
            min_p=packed[3].float() if any(p.min_p > 0 for p in params) else None,
            generators=[None if p.seed is None else self._generator(r.seq_id, p.seed) for r, p in zip(rows, params)],
            all_greedy=all(t == 0 for t in temperatures),
            any_greedy=any(t == 0 for t in temperatures),
            max_num_logprobs=max(wants_logprobs) if wants_logprobs else None,
            logit_bias=self._logit_bias(params),
        )

    def _logit_bias(self, params: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(row, token id, bias) of every entry, or None when no row has one."""
        entries = [(i, token_id, bias) for i, p in enumerate(params) for token_id, bias in p.logit_bias]
        if not entries:
            return None
        rows, ids, biases = zip(*entries)
        packed = upload(np.array([rows, ids], dtype=np.int64), self.device)
        return packed[0], packed[1], upload(np.array(biases, dtype=np.float32), self.device)
