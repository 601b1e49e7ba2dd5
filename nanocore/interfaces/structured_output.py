"""StructuredOutputBackend: constrain what a request may generate (since 1.5).

A backend is built once per engine with the model's token vocabulary. It compiles a request's constraint (a JSON
schema, any JSON object, a regular expression, a grammar or a choice list) into an object that any number of
matchers share; a matcher follows one request. Each step the core asks the matcher for a token bitmask of the
request's next token, samples from the allowed tokens only, and tells the matcher which token was taken. A planned
step that is discarded (speculative or asynchronous scheduling) rolls the matcher back.

Bitmask layout (xgrammar's, so masks cross libraries without copies): an int32 tensor ``[batch, ceil(vocab_size /
32)]`` on the CPU; token ``t`` is allowed in row ``r`` when bit ``t % 32`` of ``bitmask[r, t // 32]`` is set.
``nanocore.toolkit.token_bitmask`` packs, unpacks and applies such masks.

Rules the conformance suite checks:
- Every sequence sampled from the masks, up to a stop token, satisfies the constraint (a JSON schema is checked with
  ``jsonschema``); the mask allows a stop token exactly where the text so far is a complete match.
- After any accepted prefix that can still be completed, the mask allows at least one token.
- ``accept_token`` of a token the mask forbids returns False and leaves the matcher unchanged.
- ``rollback(n)`` returns the matcher to where it was ``n`` accepted tokens ago (the stop token counts).
- ``compile`` of a bad constraint (an invalid schema, a regular expression that does not compile, a kind the backend
  does not declare in ``constraint_kinds``) raises ValueError saying what is wrong.
- A backend that ``auto`` may choose fills one request's mask in at most 0.2 ms on a CPU core at a 151,936-token
  vocabulary (Qwen3's).

Calls: ``compile`` may take seconds and runs off the event loop, possibly on several threads at once (it must be
thread-safe); the core caches its result per ``Constraint``. ``matcher`` and the matcher's methods run on the
engine's scheduler thread, once per request per step: keep them fast.

Constructor: ``__init__(self, vocabulary: TokenVocabulary, options=None)``, the vocabulary passed positionally by
the registry, ``options`` from the user's ``structured_output_options``.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from nanocore.interfaces.base import Backend

#: The constraint kinds, as the OpenAI front names them: ``json_schema``, ``json_object`` (any JSON object),
#: ``regex`` (Python / JavaScript syntax), ``grammar`` (GBNF: EBNF with a ``root`` rule, as llama.cpp and
#: xgrammar read it) and ``choice`` (exactly one of a list of strings).
CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")


@dataclass(frozen=True)
class Constraint:
    """What one request must generate. Hashable: compiled constraints are cached by it.

    ``value`` is the schema as canonical JSON text (build it with ``Constraint.json_schema(dict)``), the pattern,
    the grammar text, a tuple of choices, or None for ``json_object``.
    """

    kind: str
    value: str | tuple[str, ...] | None = None

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}; kinds are {list(CONSTRAINT_KINDS)}")
        if self.kind == "json_object":
            if self.value is not None:
                raise ValueError("a json_object constraint takes no value; use json_schema to give a schema")
        elif self.kind == "choice":
            ok = isinstance(self.value, tuple) and self.value and all(isinstance(c, str) and c for c in self.value)
            if not ok:
                raise ValueError(f"a choice constraint needs a non-empty tuple of non-empty strings, got {self.value!r}")
        elif not (isinstance(self.value, str) and self.value.strip()):
            raise ValueError(f"a {self.kind} constraint needs its text as a non-empty string, got {self.value!r}")
        if self.kind == "json_schema" and not isinstance(self.schema, dict):
            raise ValueError(f"a JSON schema must be a JSON object, got {self.value!r}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> Constraint:
        """From a schema dict or its JSON text; keys are sorted, so equal schemas share one cache entry."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        return cls("json_schema", json.dumps(schema, sort_keys=True, ensure_ascii=False))

    @classmethod
    def choice(cls, choices: list[str] | tuple[str, ...]) -> Constraint:
        return cls("choice", tuple(choices))

    @property
    def schema(self) -> Any:
        """The JSON schema, parsed (``json_schema`` constraints only)."""
        try:
            return json.loads(self.value)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None


@dataclass(frozen=True)
class TokenVocabulary:
    """The model's tokens as bytes: what each token id adds to the generated text.

    ``token_bytes[i]`` is empty for special tokens (they are never allowed, except stop tokens where the constraint is
    complete). ``vocab_size`` is the width of the model's logits: ids from ``len(token_bytes)`` up are padding and
    never allowed. ``nanocore.toolkit.vocabulary.token_vocabulary`` builds one from a Hugging Face tokenizer.
    """

    token_bytes: tuple[bytes, ...]
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    def __post_init__(self):
        if self.vocab_size < len(self.token_bytes):
            raise ValueError(f"vocab_size {self.vocab_size} is smaller than the {len(self.token_bytes)} tokens given")
        if not self.stop_token_ids:
            raise ValueError("a vocabulary needs at least one stop token id (the model's end-of-sequence token)")
        bad = [t for t in self.stop_token_ids if not 0 <= t < len(self.token_bytes)]
        if bad:
            raise ValueError(f"stop token ids {bad} are outside the vocabulary of {len(self.token_bytes)} tokens")

    @property
    def bitmask_words(self) -> int:
        """int32 words of one bitmask row."""
        return -(-self.vocab_size // 32)


class StructuredOutputMatcher(ABC):
    """The state of one request: which tokens may come next, advanced by the tokens taken."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the allowed next tokens into row ``row`` of ``bitmask`` (int32, CPU, layout above). Once
        terminated, the row allows the stop tokens only."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by the sampled token. Returns False, unchanged, if the constraint forbids it here."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (at most as many as were accepted)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token was accepted."""


class StructuredOutputBackend(Backend):
    #: Constraint kinds ``compile`` accepts; the others are refused with a ValueError naming them.
    constraint_kinds: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, vocabulary: TokenVocabulary, options: dict | None = None):
        super().__init__(options)
        self.vocabulary = vocabulary

    @abstractmethod
    def compile(self, constraint: Constraint) -> Any:
        """Compile ``constraint`` for this vocabulary; the result is opaque to the core and shared by matchers."""

    @abstractmethod
    def matcher(self, compiled: Any) -> StructuredOutputMatcher:
        """A fresh matcher at the start of the output, for one request."""

    def check_kind(self, constraint: Constraint) -> None:
        """Raise the ValueError ``compile`` gives for a kind this backend does not declare."""
        if constraint.kind not in self.constraint_kinds:
            raise ValueError(f"structured output backend {self.name or type(self).__name__!r} does not support "
                             f"{constraint.kind} constraints (it supports {sorted(self.constraint_kinds)}); choose "
                             f"another with structured_output=NAME (see 'nanocore plugins')")
