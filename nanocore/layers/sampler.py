"""Sampling on the device: logit edits (min_tokens bans, logit_bias, structured-output masks), temperature,
top-k, top-p, min-p, per-request seeds, logprobs.

Rows are processed together with vectorised masks; work a batch does not need (sorting for top-k /
top-p, random numbers when every row is greedy) is skipped. Seeded rows draw their exponential noise
from their own ``torch.Generator``, so a seeded request samples the same tokens in any batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nanocore.kernels import sampling as sampling_kernels
from nanocore.toolkit.token_bitmask import apply_token_bitmask_


@dataclass
class SamplingTensors:
    """Per-row parameters on the logits' device (built once per step by the ModelRunner)."""

    temperatures: torch.Tensor  # [N] float32, 0 = greedy
    top_k: torch.Tensor | None  # [N] int64, 0 = whole vocabulary; None when no row uses it
    top_p: torch.Tensor | None  # [N] float32; None when every row is 1
    min_p: torch.Tensor | None  # [N] float32; None when every row is 0
    generators: list[torch.Generator | None]  # per-row seeded RNG, None = the shared one
    all_greedy: bool
    any_greedy: bool
    max_num_logprobs: int | None = None  # None = no row wants logprobs
    #: (row index, token id) pairs whose logits are masked (min_tokens: EOS / stop ids not allowed yet).
    banned: tuple[torch.Tensor, torch.Tensor] | None = None
    seeded_rows: list[int] | None = None  # rows whose generator is set (found in ``generators`` when not given)
    #: (row index, token id, bias) of every logit_bias entry of the batch: added to those logits
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    #: structured output: (int32 bitmask ``[rows, words]``, the logits row each mask row masks); forbidden -> -inf
    token_bitmask: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self):
        if self.seeded_rows is None:
            self.seeded_rows = [i for i, g in enumerate(self.generators) if g is not None]

    @property
    def edits_logits(self) -> bool:
        return self.banned is not None or self.logit_bias is not None or self.token_bitmask is not None


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [N] int64
    #: [N, 1 + max_num_logprobs]: the sampled token's then the top tokens' ids / logprobs; ranks [N]
    logprob_token_ids: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    sampled_ranks: torch.Tensor | None = None


def edit_logits(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """float32 logits with the bans, the biases and the structured-output masks applied, before temperature and
    the filters. As in vLLM the mask comes before the logprobs; nanocore's logprobs are of the processed
    distribution (vLLM's ``logprobs_mode="processed_logprobs"``), so they see the bans and biases too."""
    logits = logits.float()
    if params.banned is not None:
        logits = logits.index_put(params.banned, torch.full((), float("-inf"), device=logits.device))  # no H2D copy
    if params.logit_bias is not None:
        rows, ids, values = params.logit_bias
        logits = logits.index_put((rows, ids), values, accumulate=True)  # a token may be biased in several rows
    if params.token_bitmask is not None:
        bitmask, rows = params.token_bitmask
        apply_token_bitmask_(logits, bitmask, rows)  # -inf stays -inf whatever the bias
    return logits


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) logits outside each row's top-k and top-p nucleus; keeps at least one token."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, sorted_idx, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` times the most likely token's."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def exponential_noise(probs: torch.Tensor, generators: list[torch.Generator | None],
                      default: torch.Generator | None, seeded: list[int]) -> torch.Tensor:
    """Exp(1) noise per row; seeded rows (their indices: ``seeded``) use their own generator so they do not
    depend on the batch."""
    noise = torch.empty_like(probs)
    if len(seeded) < len(generators):
        noise.exponential_(generator=default)
    for i in seeded:
        noise[i].exponential_(generator=generators[i])
    return noise


class Sampler(nn.Module):
    def __init__(self, generator: torch.Generator | None = None):
        super().__init__()
        self.generator = generator  # shared RNG of unseeded rows (seeded from the engine config)

    #: the one-pass Triton kernel for plain temperature / greedy batches on CUDA (False: always the torch path)
    use_fused_kernel = True

    def forward(self, logits: torch.Tensor, params: SamplingTensors) -> SamplerOutput:
        if params.all_greedy and not params.edits_logits and params.max_num_logprobs is None:
            return SamplerOutput(logits.argmax(dim=-1))  # no float copy and no random draw (argmax is exact in bf16)
        if self._fused_applies(logits, params):
            seed = torch.randint(0, 2**62, (1,), generator=self.generator, device=logits.device)
            return SamplerOutput(sampling_kernels.gumbel_argmax(logits, params.temperatures, seed))
        logits = edit_logits(logits, params)
        if params.all_greedy:
            processed = logits
            token_ids = logits.argmax(dim=-1)
        else:
            temps = params.temperatures.unsqueeze(1)
            processed = logits / torch.where(temps > 0, temps, torch.ones_like(temps))
            processed = apply_top_k_top_p(processed, params.top_k, params.top_p)
            if params.min_p is not None:
                processed = apply_min_p(processed, params.min_p)
            probs = processed.softmax(dim=-1)
            # Gumbel-max in exponential form: argmax p / E with E ~ Exp(1) samples from p
            token_ids = (probs / exponential_noise(probs, params.generators, self.generator, params.seeded_rows)).argmax(dim=-1)
            if params.any_greedy:
                token_ids = torch.where(params.temperatures == 0, logits.argmax(dim=-1), token_ids)
        if params.max_num_logprobs is None:
            return SamplerOutput(token_ids)
        return self._logprobs(processed, token_ids, params.max_num_logprobs)

    def _fused_applies(self, logits: torch.Tensor, params: SamplingTensors) -> bool:
        """Only batches the kernel samples exactly: no filters, logit edits, logprobs or per-request seeds."""
        if not (self.use_fused_kernel and logits.is_cuda and sampling_kernels.triton is not None):
            return False
        if params.top_k is not None or params.top_p is not None or params.min_p is not None:
            return False
        return not params.edits_logits and params.max_num_logprobs is None and not params.seeded_rows

    @staticmethod
    def _logprobs(processed: torch.Tensor, token_ids: torch.Tensor, num: int) -> SamplerOutput:
        """The sampled token's logprob and rank, and the top-``num`` of the processed distribution."""
        logprobs = processed.log_softmax(dim=-1)
        num = min(num, logprobs.shape[-1])  # asking for more than the vocabulary returns all of it
        sampled = logprobs.gather(1, token_ids.unsqueeze(1))
        ranks = (logprobs > sampled).sum(dim=-1) + 1
        top_lp, top_ids = logprobs.topk(num, dim=-1) if num else (sampled[:, :0], token_ids[:, None][:, :0])
        return SamplerOutput(
            token_ids,
            logprob_token_ids=torch.cat([token_ids.unsqueeze(1), top_ids], dim=1),
            logprobs=torch.cat([sampled, top_lp], dim=1),
            sampled_ranks=ranks,
        )
