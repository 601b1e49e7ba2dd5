"""``reference``: masks by trying every token's bytes against an exact incremental checker (slow; for tests).

JSON schemas (a subset, see ``json_automaton``) and ``json_object`` run a pushdown automaton; regular expressions run
the ``regex`` package's partial matching; choices compare prefixes. Text is matched by characters: a token ending
inside a multi-byte character is allowed when some character it can start may come next. ``auto`` never picks
this backend: a mask costs milliseconds for a few hundred tokens and seconds at a real vocabulary.
"""
from __future__ import annotations

import codecs

import regex

from nanocore.builtin import json_automaton
from nanocore.interfaces import (
    Constraint,
    StructuredOutputBackend,
    StructuredOutputMatcher,
    TokenVocabulary,
    builtin_options,
)
from nanocore.toolkit.token_bitmask import fill_bitmask_row


class JsonChecker:
    def __init__(self, root: json_automaton.Node):
        self.start = json_automaton.start(root)

    feed = staticmethod(json_automaton.feed)
    is_complete = staticmethod(json_automaton.is_complete)
    partial_char_ok = staticmethod(json_automaton.partial_char_ok)


class RegexChecker:
    """State: the text so far. A character is taken when the text could still grow into a full match."""

    start = ""

    def __init__(self, pattern: str):
        try:
            self.pattern = regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"the regular expression {pattern!r} does not compile: {exc}") from None

    def feed(self, text: str, ch: str) -> str | None:
        text += ch
        return text if self.pattern.fullmatch(text, partial=True) else None

    def is_complete(self, text: str) -> bool:
        match = self.pattern.fullmatch(text)
        return match is not None

    def partial_char_ok(self, text: str, tail: bytes) -> bool:
        return any(self.feed(text, ch) is not None for ch in characters_starting_with(tail))


class ChoiceChecker:
    start = ""

    def __init__(self, choices: tuple[str, ...]):
        self.choices = choices

    def feed(self, text: str, ch: str) -> str | None:
        text += ch
        return text if any(c.startswith(text) for c in self.choices) else None

    def is_complete(self, text: str) -> bool:
        return text in self.choices

    def partial_char_ok(self, text: str, tail: bytes) -> bool:
        return any(c.startswith(text) and c[len(text):].encode().startswith(tail) for c in self.choices)


def characters_starting_with(tail: bytes):
    """Every character whose UTF-8 encoding starts with ``tail`` (an incomplete sequence), lowest first."""
    length = 2 if tail[0] < 0xE0 else 3 if tail[0] < 0xF0 else 4
    low = int.from_bytes(tail + b"\x80" * (length - len(tail)), "big")
    high = int.from_bytes(tail + b"\xbf" * (length - len(tail)), "big")
    for encoded in range(low, high + 1):
        raw = encoded.to_bytes(length, "big")
        try:
            yield raw.decode()
        except UnicodeDecodeError:
            continue


def advance(checker, state, pending: bytes, data: bytes):
    """(state, incomplete bytes) after ``data``, or None if the constraint can no longer be met."""
    raw = pending + data
    if raw.isascii():
        text, tail = raw.decode(), b""
    else:
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            text = decoder.decode(raw)
        except UnicodeDecodeError:
            return None
        tail = decoder.getstate()[0]
    for ch in text:
        state = checker.feed(state, ch)
        if state is None:
            return None
    if tail and not checker.partial_char_ok(state, tail):
        return None
    return state, tail


class ReferenceMatcher(StructuredOutputMatcher):
    def __init__(self, checker, vocabulary: TokenVocabulary):
        self.checker, self.vocabulary = checker, vocabulary
        self.stop_ids = frozenset(vocabulary.stop_token_ids)
        self.history = [(checker.start, b"", False)]  # (state, incomplete bytes, terminated) after each token

    def allowed(self, token_id: int) -> tuple | None:
        """The history entry after ``token_id``, or None if it is forbidden here."""
        state, pending, terminated = self.history[-1]
        if terminated or not 0 <= token_id < len(self.vocabulary.token_bytes):
            return None
        if token_id in self.stop_ids:
            return (state, pending, True) if not pending and self.checker.is_complete(state) else None
        data = self.vocabulary.token_bytes[token_id]
        after = advance(self.checker, state, pending, data) if data else None
        return None if after is None else (*after, False)

    def fill_bitmask(self, bitmask, row=0):
        if self.is_terminated():
            allowed = self.stop_ids
        else:
            allowed = [t for t in range(len(self.vocabulary.token_bytes)) if self.allowed(t) is not None]
        fill_bitmask_row(bitmask, row, allowed, self.vocabulary.vocab_size)

    def accept_token(self, token_id):
        after = self.allowed(token_id)
        if after is None:
            return False
        self.history.append(after)
        return True

    def rollback(self, num_tokens):
        if not 0 <= num_tokens < len(self.history):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {len(self.history) - 1} were accepted")
        del self.history[len(self.history) - num_tokens:]

    def is_terminated(self):
        return self.history[-1][2]


class ReferenceStructuredOutput(StructuredOutputBackend):
    constraint_kinds = frozenset({"json_schema", "json_object", "regex", "choice"})

    def __init__(self, vocabulary: TokenVocabulary, options: dict | None = None):
        super().__init__(vocabulary, builtin_options(self, ReferenceStructuredOutput, "reference", options, {}))

    def compile(self, constraint: Constraint):
        self.check_kind(constraint)
        if constraint.kind == "json_schema":
            return JsonChecker(json_automaton.compile_schema(constraint.schema))
        if constraint.kind == "json_object":
            return JsonChecker(json_automaton.Node({"object"}, additional=json_automaton.any_value()))
        if constraint.kind == "regex":
            return RegexChecker(constraint.value)
        return ChoiceChecker(constraint.value)

    def matcher(self, compiled) -> ReferenceMatcher:
        return ReferenceMatcher(compiled, self.vocabulary)
