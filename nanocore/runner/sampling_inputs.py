"""The sampler's per-row inputs of a step, built on the host and uploaded in one copy."""
from __future__ import annotations

import numpy as np
import torch

from nanocore.runner.host_transfer import upload
from nanocore.layers.sampler import SamplingTensors


def build_sampling_tensors(seqs: list[Sequence], eos_token_ids: list[int],
                           device: torch.device) -> tuple[SamplingTensors, list[tuple[int, Sequence, list[int]]]]:
    """The per-row parameters (one packed upload) and, for rows with min_tokens, the ids they may ban."""
    params = [s.sampling_params for s in seqs]
    temperatures = [p.temperature for p in params]
    packed = upload(np.array([temperatures, [p.top_k for p in params], [p.top_p for p in params],
                              [p.min_p for p in params]], dtype=np.float64), device)  # float64: top_k stays exact
    min_tokens_rows = []
    for row, (seq, p) in enumerate(zip(seqs, params)):
        if p.min_tokens > 0:
            ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            min_tokens_rows.append((row, seq, sorted(ids)))
    wants_logprobs = [p.logprobs for p in params if p.logprobs is not None]
    generators = [s.generator for s in seqs]
    base = SamplingTensors(
        temperatures=packed[0].float(),
        top_k=packed[1].long() if any(p.top_k for p in params) else None,
        top_p=packed[2].float() if any(p.top_p < 1 for p in params) else None,
        min_p=packed[3].float() if any(p.min_p > 0 for p in params) else None,
        generators=generators,
        all_greedy=all(t == 0 for t in temperatures),
        any_greedy=any(t == 0 for t in temperatures),
        max_num_logprobs=max(wants_logprobs) if wants_logprobs else None,
    )
    return base, min_tokens_rows
