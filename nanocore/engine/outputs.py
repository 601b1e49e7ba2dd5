"""What ``LLM.generate`` returns, mirroring vLLM's ``RequestOutput`` / ``CompletionOutput``."""
from __future__ import annotations

from dataclasses import dataclass, field

from nanocore.engine.detokenizer import decode_output


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = most likely under the processed distribution
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    #: One dict per generated token: token id -> Logprob (top-N plus the sampled token); None if not asked.
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop" or "length"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    #: with ``prompt_logprobs``: None for the first prompt token, then one dict per prompt token (as ``logprobs``)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class EngineStats:
    """Counters since the engine started (``LLM.stats()``)."""

    num_steps: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of added sequences (n per request)
    num_computed_tokens: int = 0  # tokens run through the model (prefill, recompute and decode)
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0  # of those, served by the prefix cache (never the recomputed last block)
    num_preemptions: int = 0
    num_finished_requests: int = 0
    #: async scheduling: steps whose forward was queued before the previous step's tokens were read, and
    #: such look-ahead forwards thrown away (the batch changed: an admission, an abort of every row...)
    num_overlapped_steps: int = 0
    num_discarded_lookaheads: int = 0
    prefix_cache: dict = field(default_factory=dict)


def request_output(request_id: str, prompt, prompt_token_ids: list[int], seqs, detokenizers, finished: bool,
                   tokenizer) -> RequestOutput:
    """A request's output so far: one completion per sequence (``n`` samples)."""
    return RequestOutput(
        request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
        outputs=[completion_output(seq, det, tokenizer) for seq, det in zip(seqs, detokenizers)],
        finished=finished, num_cached_tokens=max(0, seqs[0].num_cached_tokens),
        prompt_logprobs=prompt_logprobs(seqs[0], tokenizer),
    )


def prompt_logprobs(seq, tokenizer) -> list[dict[int, Logprob] | None] | None:
    """vLLM's layout: None for the first prompt token (nothing predicts it), then one dict per scored token."""
    if seq.prompt_logprobs is None:
        return None
    return [None, *(logprob_dict(entry, tokenizer) for entry in seq.prompt_logprobs)]


def completion_output(seq, detokenizer, tokenizer) -> CompletionOutput:
    """One sequence's text, tokens, finish and logprobs (the detokenizer's text when the request streams)."""
    token_ids = seq.output_token_ids
    if detokenizer is not None:
        text = detokenizer.output_text
    else:  # a final stop token (EOS, stop id) is kept in token_ids but not in the text
        stopped_by_token = seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str)
        text = decode_output(tokenizer, token_ids[:-1] if stopped_by_token else token_ids,
                             seq.sampling_params.skip_special_tokens)
    out = CompletionOutput(seq.index, text, token_ids, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason)
    if seq.output_logprobs is not None:
        out.logprobs = [logprob_dict(entry, tokenizer) for entry in seq.output_logprobs]
        out.cumulative_logprob = sum(entry[1][0] for entry in seq.output_logprobs)
    return out


def logprob_dict(entry: tuple[list[int], list[float], int], tokenizer) -> dict[int, Logprob]:
    """One sampled position's (ids, logprobs, rank of the sampled id) as {token id: Logprob}, decoded."""
    ids, lps, sampled_rank = entry
    decode = (lambda t: tokenizer.decode([t])) if tokenizer is not None else (lambda t: None)
    out = {ids[0]: Logprob(lps[0], sampled_rank, decode(ids[0]))}
    for rank, (token_id, lp) in enumerate(zip(ids[1:], lps[1:]), start=1):
        out.setdefault(token_id, Logprob(lp, rank, decode(token_id)))
    return out
