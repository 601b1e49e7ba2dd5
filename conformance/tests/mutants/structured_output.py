"""Structured output backends the suite must accept (CORRECT) and reject (MUTANTS).

The correct ones are the builtin ``reference`` backend and xgrammar. Each mutant changes one thing of the reference
backend, as a real author could get it wrong.
"""
from __future__ import annotations

from nanocore.interfaces import Constraint
from nanocore.toolkit.reference import ReferenceStructuredOutput
from nanocore.toolkit.token_bitmask import pack_bitmask, unpack_bitmask
from nanocore_conformance import StructuredOutputConformance, bind_all
from nanocore_xgrammar import XGrammarStructuredOutput


class Reference(ReferenceStructuredOutput):
    """The builtin backend under its own class name (bind_all names the test class after it)."""


class IgnoresRequired(ReferenceStructuredOutput):
    """Compiles schemas without their ``required`` lists: '}' is allowed before the required keys are there."""

    def compile(self, constraint):
        if constraint.kind == "json_schema":
            constraint = Constraint.json_schema(strip_required(constraint.schema))
        return super().compile(constraint)


def strip_required(schema):
    if isinstance(schema, dict):
        return {k: strip_required(v) for k, v in schema.items() if k != "required"}
    return schema


class ReversedBitOrder(ReferenceStructuredOutput):
    """Packs token t into bit 31 - t % 32 of its word (big-endian bits): other tokens than the allowed ones."""

    def matcher(self, compiled):
        matcher = super().matcher(compiled)
        fill = matcher.fill_bitmask

        def reversed_fill(bitmask, row=0):
            fill(bitmask, row)
            allowed = unpack_bitmask(bitmask[row], 32 * bitmask.shape[1])
            bitmask[row] = pack_bitmask(allowed.view(-1, 32).flip(-1).flatten())

        matcher.fill_bitmask = reversed_fill
        return matcher


class WritesRowZero(ReferenceStructuredOutput):
    """Ignores ``row``: every matcher of a batch writes the first row, the others keep stale bits."""

    def matcher(self, compiled):
        matcher = super().matcher(compiled)
        fill = matcher.fill_bitmask
        matcher.fill_bitmask = lambda bitmask, row=0: fill(bitmask, 0)
        return matcher


class ForgetsRollback(ReferenceStructuredOutput):
    """``rollback(n)`` undoes only the last token whatever ``n`` is."""

    def matcher(self, compiled):
        matcher = super().matcher(compiled)
        rollback = matcher.rollback
        matcher.rollback = lambda num_tokens: rollback(min(num_tokens, 1))
        return matcher


class StuckAfterWhitespace(ReferenceStructuredOutput):
    """A state with no way out: after a token that left the JSON state as it was (whitespace, a valid prefix), the
    mask forbids everything."""

    def matcher(self, compiled):
        matcher = super().matcher(compiled)
        fill, history = matcher.fill_bitmask, matcher.history

        def fill_or_nothing(bitmask, row=0):
            fill(bitmask, row)
            if len(history) > 1 and history[-1] == history[-2]:
                bitmask[row] = 0

        matcher.fill_bitmask = fill_or_nothing
        return matcher


class AcceptsAnything(ReferenceStructuredOutput):
    """``accept_token`` never says no: a forbidden token is taken (and the state moves on regardless)."""

    def matcher(self, compiled):
        matcher = super().matcher(compiled)
        accept = matcher.accept_token

        def accept_all(token_id):
            if not accept(token_id):
                matcher.history.append(matcher.history[-1])
            return True

        matcher.accept_token = accept_all
        return matcher


class AcceptsUnknownOptions(ReferenceStructuredOutput):
    """Takes any options dict without checking it."""

    def __init__(self, vocabulary, options=None):
        super().__init__(vocabulary)
        self.options = dict(options or {})


CORRECT = [Reference, XGrammarStructuredOutput]
MUTANTS = [IgnoresRequired, ReversedBitOrder, WritesRowZero, ForgetsRollback, StuckAfterWhitespace, AcceptsAnything,
           AcceptsUnknownOptions]

bind_all(globals(), StructuredOutputConformance, CORRECT + MUTANTS)
