"""Structured output in the engine: the one owner of each constrained sequence's matcher.

The backend (``structured_output=`` in the engine config) is built on the first constrained request, from the
model's tokenizer. A request's constraint is compiled when the request is added, once per distinct ``Constraint``
(cached), so steps never compile; each of its sequences gets a matcher. Each step, after the scheduler plans it,
``fill`` writes the plan's token bitmask, one row per constrained row that samples; rank 0's sampler applies it to
the logits. ``advance``, run by the scheduler's update for each sampled token, accepts the token.

Async scheduling needs no rollback: a look-ahead queues only the next step's forward, and that step's sampling is
queued with its own plan, whose masks are filled after this step's tokens were accepted. A constrained row is never
sampled ahead of its mask.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from nanocore.config import EngineConfig
from nanocore.engine.output_processor import INVALID_REQUEST, Stop
from nanocore.engine.sequence import Sequence
from nanocore.interfaces import Constraint, StructuredOutputBackend, StructuredOutputMatcher
from nanocore.plugins import build_backend
from nanocore.runner.step_plan import ScheduledRow, StepPlan
from nanocore.toolkit.token_bitmask import allocate_token_bitmask, pack_bitmask, unpack_bitmask
from nanocore.toolkit.vocabulary import token_vocabulary

#: distinct constraints kept compiled: a server sees a few schemas again and again
COMPILED_CACHE_SIZE = 256


class _Refused:
    """A constraint the backend refused, cached with its message."""

    def __init__(self, message: str):
        self.message = message


class StructuredOutputs:
    def __init__(self, config: EngineConfig, device: torch.device, tokenizer, vocab_size: int | None,
                 stop_token_ids):
        """``vocab_size``: the model's logits width (None: the tokenizer's length); ``stop_token_ids``: the
        engine's end-of-sequence ids, the only tokens a complete constraint allows."""
        self.config, self.device, self.tokenizer, self.vocab_size = config, device, tokenizer, vocab_size
        self.stop_token_ids = sorted(stop_token_ids) or None
        self._backend: StructuredOutputBackend | None = None
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.matchers: dict[int, StructuredOutputMatcher] = {}  # seq id -> its matcher, until it finishes
        self.failed: dict[int, str] = {}  # seq id -> why its matcher cannot go on (ends it at its next token)

    @property
    def backend(self) -> StructuredOutputBackend:
        with self._lock:
            if self._backend is None:
                if self.tokenizer is None:
                    raise ValueError("structured output needs the model's tokenizer (each token's text) and this "
                                     "model has none; give it one with tokenizer=FOLDER")
                vocabulary = token_vocabulary(self.tokenizer, self.vocab_size, self.stop_token_ids)
                self._backend = build_backend("structured_output", self.config, self.device, vocabulary)
            return self._backend

    def compile(self, constraint: Constraint) -> Any:
        """The backend's compiled ``constraint`` (cached); ValueError when the backend refuses it (cached too, so a
        bad schema sent again is not compiled again)."""
        with self._lock:
            compiled = self._compiled.get(constraint)
            if compiled is not None:
                self._compiled.move_to_end(constraint)
        if compiled is None:
            try:
                compiled = self.backend.compile(constraint)  # outside the lock: compiles may run side by side
            except ValueError as exc:
                compiled = _Refused(str(exc))
            with self._lock:
                self._compiled[constraint] = compiled
                while len(self._compiled) > COMPILED_CACHE_SIZE:
                    self._compiled.popitem(last=False)
        if isinstance(compiled, _Refused):
            raise ValueError(compiled.message)
        return compiled

    def is_compiled(self, constraint: Constraint) -> bool:
        """Whether ``compile(constraint)`` answers from the cache (a refusal counts)."""
        with self._lock:
            return constraint in self._compiled

    def add(self, seq_ids: list[int], compiled: Any) -> None:
        """A fresh matcher for each sequence (a request's ``n`` samples each follow the constraint)."""
        for seq_id in seq_ids:
            self.matchers[seq_id] = self.backend.matcher(compiled)

    def drop(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.matchers.pop(seq.seq_id, None)
            self.failed.pop(seq.seq_id, None)

    # ---- each step -----------------------------------------------------------------------
    def fill(self, plan: StepPlan) -> None:
        """Set ``plan.token_bitmask`` / ``bitmask_rows``: the allowed next tokens of its constrained sampling rows."""
        matchers, constrained, index = self.matchers, [], 0
        for row in plan.rows:
            if row.samples:
                if row.seq_id in matchers:
                    constrained.append((index, row))
                index += 1
        if not constrained:
            return
        # a fresh tensor every step: the previous one may still be on its way to the device
        bitmask = allocate_token_bitmask(len(constrained), self.backend.vocabulary.vocab_size)
        for j, (_, row) in enumerate(constrained):
            if row.seq_id not in self.failed:
                self._fill_row(bitmask, j, row)
        for j in (~bitmask.bool().any(dim=1)).nonzero().flatten().tolist():
            row = constrained[j][1]
            self.failed.setdefault(row.seq_id, self._empty_mask_reason(row))
        for j, (_, row) in enumerate(constrained):
            if row.seq_id in self.failed:  # it ends with an error at this token: let it take a stop token
                bitmask[j] = self._stop_only_row()
        plan.token_bitmask, plan.bitmask_rows = bitmask, [i for i, _ in constrained]

    def _fill_row(self, bitmask: torch.Tensor, j: int, row: ScheduledRow) -> None:
        self.matchers[row.seq_id].fill_bitmask(bitmask, j)
        if row.num_output_tokens < row.sampling.min_tokens and row.sampling.min_tokens_banned:
            # the sampler bans these too; clearing them here shows a row the bans would leave empty
            allowed = unpack_bitmask(bitmask[j], self.backend.vocabulary.vocab_size)
            allowed[list(row.sampling.min_tokens_banned)] = False
            bitmask[j] = pack_bitmask(allowed)

    def _stop_only_row(self) -> torch.Tensor:
        allowed = torch.zeros(self.backend.vocabulary.vocab_size, dtype=torch.bool)
        allowed[list(self.backend.vocabulary.stop_token_ids)] = True
        return pack_bitmask(allowed)

    @staticmethod
    def _empty_mask_reason(row: ScheduledRow) -> str:
        if row.num_output_tokens < row.sampling.min_tokens:
            return (f"{INVALID_REQUEST}structured output: the constraint is complete after {row.num_output_tokens} "
                    f"tokens, but min_tokens={row.sampling.min_tokens} forbids the stop token; lower min_tokens")
        return (f"structured output: the constraint allows no next token after {row.num_output_tokens} generated "
                f"tokens (the backend's mask is empty); the request was ended rather than sample outside it")

    def advance(self, seq: Sequence) -> Stop | None:
        """Accept ``seq``'s newest token: ("error", why) when it cannot, ("stop", None) once the matcher took a
        stop token where the constraint is complete, else None."""
        matcher = self.matchers.get(seq.seq_id)
        if matcher is None:
            return None
        failed = self.failed.get(seq.seq_id)
        if failed is not None:
            return "error", failed
        token_id = seq.token_ids[-1]
        if not matcher.accept_token(token_id):
            return "error", (f"structured output: the backend refused token {token_id} that its mask allowed; "
                             f"report it to the backend {self.backend.name or type(self.backend).__name__!r}")
        return ("stop", None) if matcher.is_terminated() else None
