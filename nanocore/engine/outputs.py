"""What ``LLM.generate`` returns, mirroring vLLM's ``RequestOutput`` / ``CompletionOutput``."""
from __future__ import annotations

from dataclasses import dataclass, field


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
