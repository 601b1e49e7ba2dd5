"""Per-request sampling parameters, mirroring vLLM's ``SamplingParams``."""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field

from nanocore.interfaces.structured_output import Constraint

#: torch.Generator.manual_seed takes seeds in [0, 2**64).
MAX_SEED = 2**64 - 1
#: OpenAI's bound on a logit bias: -100 forbids a token in practice, +100 forces it.
MAX_LOGIT_BIAS = 100.0


def _is_int(value) -> bool:
    """An int that is not a bool (True is never a meaningful count, id or seed)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    """A finite int or float (not a bool, not a string, not NaN / inf)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SamplingParams:
    """How to sample one request. Invalid values raise ``ValueError`` saying what is allowed."""

    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = whole vocabulary
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None = until max_model_len; 0 = the prompt only (prefill, no output)
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token (plus the sampled token's)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token (plus the prompt token's), as vLLM
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_output: Constraint | None = None  # what the output must match (a token mask per step)
    logit_bias: dict[int, float] | None = None  # token id -> additive bias in [-100, 100]
    _stop: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stop is not None and (isinstance(self.stop, (bytes, dict)) or not isinstance(self.stop, (str, Iterable))):
            raise ValueError(f"stop must be a string or a list of strings, got {type(self.stop).__name__} {self.stop!r}")
        self._stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        ids = self.stop_token_ids
        if hasattr(ids, "tolist"):  # a numpy array or a tensor of ids
            ids = ids.tolist()
        if ids is not None:
            bad = f"stop_token_ids must be a list of integer token ids, got {self.stop_token_ids!r}"
            if isinstance(ids, (str, bytes, dict)) or not isinstance(ids, Iterable):
                raise ValueError(bad)
            ids = list(ids)
            if not all(_is_int(t) for t in ids):
                raise ValueError(bad)
        self.stop_token_ids = [int(t) for t in (ids or [])]
        for name in ("temperature", "top_p", "min_p"):  # 0-d numpy / torch scalars become Python floats
            value = getattr(self, name)
            if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
                setattr(self, name, value.item())
        if self.top_k == -1:
            self.top_k = 0
        self._validate()
        self.logit_bias = _checked_logit_bias(self.logit_bias)
        for name in ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs",
                     "prompt_logprobs"):  # numpy ints -> int
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, int(value))

    def _validate(self) -> None:
        checks = [
            (_is_int(self.n) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}"),
            (_is_real(self.temperature) and self.temperature >= 0,
             f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}"),
            (_is_int(self.top_k) and self.top_k >= 0,
             f"top_k must be a positive integer, or 0 / -1 for the whole vocabulary, got {self.top_k!r}"),
            (_is_real(self.top_p) and 0 < self.top_p <= 1, f"top_p must be a number in (0, 1], got {self.top_p!r}"),
            (_is_real(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be a number in [0, 1], got {self.min_p!r}"),
            (self.seed is None or (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED),
             f"seed must be None or an integer in [0, 2**64), got {self.seed!r}"),
            (self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 0),
             f"max_tokens must be None or an integer >= 0 (0: score the prompt only), got {self.max_tokens!r}"),
            (self.prompt_logprobs is None or (_is_int(self.prompt_logprobs) and self.prompt_logprobs >= 0),
             f"prompt_logprobs must be None or an integer >= 0 (number of top tokens), got {self.prompt_logprobs!r}"),
            (_is_int(self.min_tokens) and self.min_tokens >= 0,
             f"min_tokens must be an integer >= 0, got {self.min_tokens!r}"),
            (not (_is_int(self.min_tokens) and _is_int(self.max_tokens)) or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"),
            (all(isinstance(s, str) and s for s in self._stop), f"stop must be non-empty strings, got {self.stop!r}"),
            (all(t >= 0 for t in self.stop_token_ids), f"stop_token_ids must be >= 0, got {self.stop_token_ids}"),
            (self.logprobs is None or (_is_int(self.logprobs) and self.logprobs >= 0),
             f"logprobs must be None or an integer >= 0 (number of top tokens), got {self.logprobs!r}"),
            (self.structured_output is None or isinstance(self.structured_output, Constraint),
             f"structured_output must be None or a nanocore.interfaces.Constraint (Constraint.json_schema(schema), "
             f"Constraint('regex', pattern), Constraint.choice([...])...), got {self.structured_output!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def stop_strings(self) -> list[str]:
        return self._stop

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _checked_logit_bias(bias) -> dict[int, float] | None:
    """``bias`` as {token id: float}, or a ValueError naming the bad entry (the token ids' upper bound, the
    vocabulary size, is checked where the engine adds the request)."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__} {bias!r}")
    checked = {}
    for token_id, value in bias.items():
        if not (_is_int(token_id) and token_id >= 0):
            raise ValueError(f"logit_bias keys must be integer token ids >= 0, got {token_id!r}")
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if not (_is_real(value) and -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS):
            raise ValueError(f"logit_bias of token {token_id} must be a number in [-100, 100], got {value!r}")
        checked[int(token_id)] = float(value)
    return checked
