"""One sequence being generated: its tokens, KV blocks and progress. Satisfies ``SequenceView``."""
from __future__ import annotations

from enum import Enum

from nanocore.engine.sampling_params import SamplingParams
from nanocore.runner.step_plan import RowSampling


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    __slots__ = (
        "seq_id", "arrival_index", "request_id", "index", "token_ids", "num_tokens", "num_prompt_tokens",
        "num_computed_tokens", "num_published_blocks", "block_table", "sampling_params", "status",
        "num_cached_tokens", "finish_reason", "stop_reason", "output_logprobs", "sampling", "max_tokens",
        "prompt_logprobs",
    )

    def __init__(self, seq_id: int, arrival_index: int, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, max_tokens: int, request_id: str = "", index: int = 0,
                 sampling: RowSampling | None = None):
        """``sampling``: how the runner samples it (by default ``row_sampling(sampling_params)``)."""
        self.seq_id = seq_id
        self.arrival_index = arrival_index
        self.request_id = request_id
        self.index = index  # which of the request's n samples
        self.token_ids = list(prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens = len(self.token_ids)  # num_tokens: kept by append_token (hot)
        self.num_computed_tokens = 0
        self.num_published_blocks = 0  # full blocks already inserted into the prefix cache
        self.block_table: list[int] = []
        self.sampling_params = sampling_params
        self.max_tokens = max_tokens  # resolved against max_model_len
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = -1  # set at first admission
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.output_logprobs: list[dict] | None = [] if sampling_params.logprobs is not None else None
        #: one entry per prompt position scored so far (its next token's); the request's first sample scores them
        self.prompt_logprobs: list[tuple] | None = (
            [] if sampling_params.prompt_logprobs is not None and index == 0 else None)
        self.sampling = sampling or row_sampling(sampling_params)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
                f"blocks={self.num_blocks}, status={self.status.value})")

    @property
    def num_blocks(self) -> int:
        return len(self.block_table)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def reaches_length(self, num_tokens: int, max_model_len: int) -> bool:
        """Whether holding ``num_tokens`` tokens ends this sequence by length (max_tokens or max_model_len)."""
        return num_tokens - self.num_prompt_tokens >= self.max_tokens or num_tokens >= max_model_len

    @property
    def scores_prompt(self) -> bool:
        """Some prompt logprobs are still to compute: the prefix cache may serve only positions already scored."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.num_tokens += 1


def row_sampling(params: SamplingParams, eos_token_ids=(), seed: int | None = None) -> RowSampling:
    """The runner's view of ``params`` for one sequence; ``seed``: its own stream (None: the shared one)."""
    banned = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    return RowSampling(params.temperature, params.top_k, params.top_p, params.min_p, params.logprobs, seed,
                       params.min_tokens, tuple(sorted(banned)), tuple(sorted((params.logit_bias or {}).items())))
