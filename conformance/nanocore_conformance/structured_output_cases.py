"""Vocabularies, constraints and the sampler of the structured-output conformance checks."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import regex
import torch

from nanocore.interfaces import Constraint, TokenVocabulary
from nanocore.toolkit.token_bitmask import allocate_token_bitmask, unpack_bitmask

STOP, SPECIAL = 0, 1  # ids of the test vocabulary's end-of-sequence and of a special token that is never text
FRAGMENTS = [
    '{"', '":', '": ', '", "', '"}', '},', '}]', '[{', '[]', '{}', 'true', 'false', 'null', 'tr', 'ue', 'nu', 'll',
    '0.5', '12', '-3', 'e+', '1e', '00', '  ', '\n  ', ' "', '\\n', '\\"', '\\u00', 'name', 'age', 'tags', 'active',
    'color', 'note', 'score', 'id', 'red', 'green', 'gr', 'een', 'blue', 'yes', 'no', 'maybe', 'may', 'be', 'abc',
    'foo', 'bar', ' foo', 'Bob', 'é', '日本', 'ab-', '-1', 'x,', '(a', 'a)', ',b', '"name": "', '"age": ',
]
PARTIAL_CHARACTERS = [b"\xe6\x97", b"\xa5", b"\xc3", b"\xa9"]  # 日 and é split inside their UTF-8 bytes
REAL_VOCAB_SIZE = 151_936  # Qwen3's logits width
REAL_NUM_TEXT_TOKENS = 151_643


def test_vocabulary() -> TokenVocabulary:
    """About 200 tokens: every printable ASCII character, JSON fragments, whole and split multi-byte characters."""
    texts = [chr(c) for c in range(32, 127)] + ["\n", "\t"] + FRAGMENTS
    tokens = [b"", b""] + [t.encode() for t in dict.fromkeys(texts)] + PARTIAL_CHARACTERS
    return TokenVocabulary(tuple(tokens), len(tokens) + 5, (STOP,))  # 5 padding ids past the tokenizer's


@lru_cache(maxsize=1)
def real_size_vocabulary() -> TokenVocabulary:
    """151,936 logits, Qwen-like: 256 single bytes, then words, numbers, punctuation runs and CJK, with and without a
    leading space; 22 special tokens; padding. Deterministic."""
    rng = random.Random(0)
    tokens = dict.fromkeys(bytes([b]) for b in range(256))
    letters, punct = "abcdefghijklmnopqrstuvwxyz", '{}[]":,.-_()<>=+*/\\!?;\'`#@$%&|~^'
    makers = [
        lambda: "".join(rng.choice(letters) for _ in range(rng.randint(2, 10))),
        lambda: "".join(rng.choice(letters) for _ in range(rng.randint(2, 8))).capitalize(),
        lambda: str(rng.randint(0, 999)),
        lambda: "".join(rng.choice(punct) for _ in range(rng.randint(2, 4))),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 3))),
    ]
    while len(tokens) < REAL_NUM_TEXT_TOKENS:
        text = rng.choice(makers)()
        tokens.setdefault(((" " if rng.random() < 0.5 else "") + text).encode(), None)
    token_bytes = tuple(tokens) + (b"",) * 22
    return TokenVocabulary(token_bytes, REAL_VOCAB_SIZE, (REAL_NUM_TEXT_TOKENS,))


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "active": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}}}}
ENUM_AND_NULL = {"type": "object", "additionalProperties": False, "required": ["color", "score"], "properties": {
    "color": {"enum": ["red", "green", "blue"]}, "note": {"type": ["string", "null"]}, "score": {"type": "number"}}}
ARRAY_OF_OBJECTS = {"type": "array", "items": {
    "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": False}}
LIST_PATTERN = r"\([a-z]+(,[a-z]+)*\)"


@dataclass(frozen=True)
class Case:
    constraint: Constraint
    #: What the reference backend compiles to check each mask (the same constraint, or an equivalent regex).
    oracle: Constraint
    #: The finished text satisfies the constraint (raises AssertionError saying why not).
    validate: Callable[[str], None]


def json_validator(schema: dict[str, Any] | None) -> Callable[[str], None]:
    def validate(text: str) -> None:
        import jsonschema

        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"not JSON ({exc}): {text!r}") from None
        if schema is None:
            assert isinstance(value, dict), f"json_object must produce an object, got {text!r}"
        else:
            try:
                jsonschema.validate(value, schema)
            except jsonschema.ValidationError as exc:
                raise AssertionError(f"does not validate ({exc.message}): {text!r}") from None
    return validate


def pattern_validator(pattern: str) -> Callable[[str], None]:
    def validate(text: str) -> None:
        assert regex.fullmatch(pattern, text), f"{text!r} does not match {pattern!r}"
    return validate


def choice_validator(choices: tuple[str, ...]) -> Callable[[str], None]:
    def validate(text: str) -> None:
        assert text in choices, f"{text!r} is none of {choices}"
    return validate


def cases() -> dict[str, Case]:
    schema_cases = {"person": PERSON, "enum_and_null": ENUM_AND_NULL, "array_of_objects": ARRAY_OF_OBJECTS}
    found = {name: Case(Constraint.json_schema(s), Constraint.json_schema(s), json_validator(s))
             for name, s in schema_cases.items()}
    found["json_object"] = Case(Constraint("json_object"), Constraint("json_object"), json_validator(None))
    for name, pattern in {"regex_code": r"[a-z]{2,5}-[0-9]{1,3}", "regex_unicode": r"\w+:[0-9]{2}"}.items():
        found[name] = Case(Constraint("regex", pattern), Constraint("regex", pattern), pattern_validator(pattern))
    choices = ("yes", "no", "maybe")
    found["choice"] = Case(Constraint.choice(choices), Constraint.choice(choices), choice_validator(choices))
    grammar = 'root ::= "(" word ("," word)* ")"\nword ::= [a-z]+'
    found["grammar"] = Case(Constraint("grammar", grammar), Constraint("regex", LIST_PATTERN),
                            pattern_validator(LIST_PATTERN))
    return found


def closing_bias(vocabulary: TokenVocabulary) -> torch.Tensor:
    """Per-token preference that ends documents: stop tokens, then quotes (closing strings), closing brackets, then separators."""
    bias = torch.zeros(vocabulary.vocab_size)
    for token_id, data in enumerate(vocabulary.token_bytes):
        last = data[-1:]
        punctuation = last.isascii() and not (last.isalnum() or last.isspace())
        bias[token_id] = 3.5 if last == b'"' else 3.0 if last in (b"}", b"]", b")") else 1.0 if punctuation else (
            -3.0 if data and data.isspace() else 0.0)  # free whitespace must not run on forever
    bias[list(vocabulary.stop_token_ids)] = 4.0
    return bias


class Sampler:
    """Samples token ids from masked random logits: a fixed per-token preference (a "model"), noise, and a pull
    towards closing the document that grows with length, so every sequence ends well before ``max_tokens``."""

    def __init__(self, vocabulary: TokenVocabulary, seed: int, temperature: float, max_tokens: int):
        gen = torch.Generator().manual_seed(seed)
        self.preference = torch.randn(vocabulary.vocab_size, generator=gen)
        self.bias, self.gen = closing_bias(vocabulary), gen
        self.temperature, self.max_tokens = temperature, max_tokens

    def pick(self, allowed: torch.Tensor, step: int) -> int:
        pull = max(0.0, (step - 8) / (self.max_tokens / 4)) * 4.0
        noise = -torch.log(-torch.log(torch.rand(allowed.shape[0], generator=self.gen).clamp_min(1e-12)))
        logits = self.preference + self.temperature * noise + pull * self.bias
        return int(logits.masked_fill(~allowed, float("-inf")).argmax())


def allowed_tokens(matcher, vocabulary: TokenVocabulary, row: int = 0, rows: int = 1) -> torch.Tensor:
    """The bool mask a matcher fills into row ``row`` of a ``rows``-row bitmask (the other rows start all-allowed)."""
    bitmask = allocate_token_bitmask(rows, vocabulary.vocab_size)
    bitmask[row] = 0x5A5A5A5A  # garbage a matcher must overwrite completely
    matcher.fill_bitmask(bitmask, row)
    return unpack_bitmask(bitmask[row], vocabulary.vocab_size)


def describe(vocabulary: TokenVocabulary, token_ids) -> str:
    return ", ".join(f"{t} {vocabulary.token_bytes[t]!r}" if t < len(vocabulary.token_bytes) else f"{t} (padding)"
                     for t in list(token_ids)[:8])
