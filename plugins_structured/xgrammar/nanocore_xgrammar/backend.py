"""``xgrammar``: constraints compiled to xgrammar's pushdown automata; masks filled by its C++ matcher.

xgrammar precomputes, per grammar state, which tokens are context-independent, so a mask costs tens of
microseconds at a 150k vocabulary. Its bitmask layout is nanocore's, so the matcher writes the core's rows directly.
"""
from __future__ import annotations

import json

import torch
import xgrammar as xgr

from nanocore.interfaces import (
    CONSTRAINT_KINDS,
    Constraint,
    StructuredOutputBackend,
    StructuredOutputMatcher,
    TokenVocabulary,
    check_options,
)
from nanocore.toolkit.token_bitmask import pack_bitmask

OPTIONS = {"any_whitespace": bool, "strict_mode": bool, "max_threads": int, "cache_limit_bytes": int}
ANY_OBJECT = '{"type": "object"}'
DEFAULT_MAX_THREADS = 8  # xgrammar's own default: compiles one grammar's rules in parallel


class XGrammarMatcher(StructuredOutputMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher, stop_only_row: torch.Tensor, text_tokens: tuple[bool, ...]):
        self.matcher, self.stop_only_row, self.text_tokens = matcher, stop_only_row, text_tokens

    def fill_bitmask(self, bitmask, row=0):
        if self.matcher.is_terminated():  # xgrammar refuses to fill after the stop token
            bitmask[row] = self.stop_only_row
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id):
        # special and padding ids are never text; asking xgrammar would only log a warning
        if not 0 <= token_id < len(self.text_tokens) or not self.text_tokens[token_id]:
            return False
        return not self.matcher.is_terminated() and self.matcher.accept_token(token_id)

    def rollback(self, num_tokens):
        try:
            self.matcher.rollback(num_tokens)
        except RuntimeError as exc:
            raise ValueError(f"cannot roll back {num_tokens} tokens: {exc}") from None

    def is_terminated(self):
        return self.matcher.is_terminated()


class XGrammarStructuredOutput(StructuredOutputBackend):
    api_version = "1.5"
    auto_priority = 10
    constraint_kinds = frozenset(CONSTRAINT_KINDS)

    def __init__(self, vocabulary: TokenVocabulary, options: dict | None = None):
        super().__init__(vocabulary, check_options("xgrammar", dict(options or {}), OPTIONS))
        info = xgr.TokenizerInfo(list(vocabulary.token_bytes), xgr.VocabType.RAW, vocab_size=vocabulary.vocab_size,
                                 stop_token_ids=list(vocabulary.stop_token_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=self.options.get("max_threads", DEFAULT_MAX_THREADS),
                                            cache_limit_bytes=self.options.get("cache_limit_bytes", -1))
        stops = torch.zeros(vocabulary.vocab_size, dtype=torch.bool)
        stops[list(vocabulary.stop_token_ids)] = True
        self.stop_only_row = pack_bitmask(stops)
        stop_ids = set(vocabulary.stop_token_ids)
        self.text_tokens = tuple(bool(b) or i in stop_ids for i, b in enumerate(vocabulary.token_bytes))

    @classmethod
    def supports(cls, device):
        return None  # masks are filled on the host for any device; the core applies them where it samples

    def compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        self.check_kind(constraint)
        try:
            whitespace = self.options.get("any_whitespace", True)
            if constraint.kind == "json_schema":
                return self.compiler.compile_json_schema(constraint.value, any_whitespace=whitespace,
                                                         strict_mode=self.options.get("strict_mode", True))
            if constraint.kind == "json_object":  # xgrammar's builtin JSON grammar also admits arrays and scalars
                return self.compiler.compile_json_schema(ANY_OBJECT, any_whitespace=whitespace, strict_mode=False)
            if constraint.kind == "regex":
                return self.compiler.compile_regex(constraint.value)
            if constraint.kind == "choice":
                return self.compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in constraint.value))
            return self.compiler.compile_grammar(constraint.value)
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[-1]
            raise ValueError(f"xgrammar cannot compile this {constraint.kind} constraint: {reason}") from None

    def matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled), self.stop_only_row, self.text_tokens)
