"""One HTTP request inside the engine loop: what it has been sent so far, and what is new after a step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from nanocore.engine.output_processor import INVALID_REQUEST
from nanocore.engine.outputs import Logprob, RequestOutput
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.sequence import SequenceStatus

#: finish_reason the engine gives a sample whose detokenization or stop check raised (the request fails alone).
ERROR_FINISH = "error"


@dataclass
class SampleDelta:
    """New output of one of a request's n samples since the last update."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    #: with the first delta of a request that scores its prompt: the prompt's logprobs (None first)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def extend(self, later: SampleDelta) -> None:
        """Append a later delta of the same sample (a slow reader gets one merged chunk)."""
        self.text += later.text
        self.token_ids += later.token_ids
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason, self.stop_reason = later.finish_reason, later.stop_reason


@dataclass
class RequestUpdate:
    deltas: list[SampleDelta] = field(default_factory=list)
    finished: bool = False
    output: RequestOutput | None = None  # the whole result, with the last update
    error: str | None = None
    status: int = 500  # HTTP status of ``error``
    new_tokens: bool = False  # some sample grew (times TTFT / ITL even when no delta is built)

    @property
    def worth_sending(self) -> bool:
        return bool(self.deltas) or self.finished


class NewRequest(NamedTuple):
    """A request as the engine client sends it to the engine loop (plain data: it may cross a pipe)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    streaming: bool  # build deltas as tokens come (else only the final output)
    arrival_time: float  # time.perf_counter() at submission (monotonic: comparable across processes of a host)


class TrackedRequest:
    """One request inside the engine loop: what it has sent so far. Owned by the loop thread."""

    def __init__(self, new: NewRequest, stream_interval: int = 1):
        self.request_id = new.request_id
        self.streaming = new.streaming
        self.stream_interval = stream_interval  # tokens per delta after the first one (fewer, larger chunks)
        self.engine_request = None  # the engine's Request, once the loop thread added it
        self.num_seen = [0] * new.params.n  # output tokens per sample at the last step (times TTFT / ITL)
        self.num_sent = [0] * new.params.n  # output tokens per sample already in a delta
        self.started = False  # admitted to a step at least once (no longer counts as waiting)
        self.arrival_time = new.arrival_time
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    def has_started(self) -> bool:
        if not self.started and self.engine_request is not None:
            self.started = any(s.status is not SequenceStatus.WAITING for s in self.engine_request.seqs)
        return self.started

    def admitted_now(self) -> bool:
        """Some sample holds KV or is scheduled (not just queued): a failed step may have touched it."""
        return any(s.status is not SequenceStatus.WAITING or s.num_blocks for s in self.engine_request.seqs)

    def collect(self, engine, output: RequestOutput | None) -> RequestUpdate | None:
        """What is new since the last call; None when nothing is. Runs on the engine loop thread."""
        deltas, grew, error, status = [], False, None, 500
        # a sample's first delta carries the prompt's logprobs: hold it while the first sample still scores them
        # (a sibling that took a prefix-cache hit can start sampling before the prompt is scored)
        scoring = self.engine_request.seqs[0].scores_prompt
        for seq, detokenizer in zip(self.engine_request.seqs, self.engine_request.detokenizers):
            index, num_output = seq.index, seq.num_output_tokens
            held = self.streaming and self.num_sent[index] == 0 < num_output and not scoring  # held, now ready
            if num_output == self.num_seen[index] and not held:
                if self.streaming and num_output == 0 and output is not None:  # max_tokens=0: a final delta
                    deltas.append(self._delta(engine, seq, detokenizer, 0))
                continue
            grew, self.num_seen[index] = grew or num_output != self.num_seen[index], num_output
            if seq.finish_reason == ERROR_FINISH:
                user_error = str(seq.stop_reason).startswith(INVALID_REQUEST)
                error = str(seq.stop_reason).removeprefix(INVALID_REQUEST) if user_error else \
                    f"generation failed: {seq.stop_reason}"
                status = 400 if user_error else 500
            sent = self.num_sent[index]
            if sent == 0 and scoring:
                continue
            if self.streaming and (sent == 0 or seq.is_finished or num_output - sent >= self.stream_interval):
                deltas.append(self._delta(engine, seq, detokenizer, sent))
                self.num_sent[index] = num_output
        if not grew and not deltas and output is None:
            return None
        return RequestUpdate(deltas, finished=output is not None or error is not None, output=output, error=error,
                             status=status, new_tokens=grew)

    def _delta(self, engine, seq, detokenizer, sent: int) -> SampleDelta:
        logprobs = None
        if seq.output_logprobs is not None:
            logprobs = [engine.logprob_dict(entry) for entry in seq.output_logprobs[sent:]]
        text = detokenizer.stream_delta(seq.is_finished) if detokenizer is not None else ""
        scored = self.engine_request.seqs[0].prompt_logprobs  # the request's first sample scores the prompt
        prompt = [None, *map(engine.logprob_dict, scored)] if sent == 0 and scored is not None else None
        return SampleDelta(seq.index, text, seq.token_ids[seq.num_prompt_tokens + sent:], logprobs,
                           seq.finish_reason, seq.stop_reason, prompt)

    def mark_tokens(self, now: float) -> tuple[float | None, float | None]:
        """(time to first token, inter-token latency): the one that applies to new tokens at ``now``."""
        first = self.first_token_time is None
        gap = None if first else now - self.last_token_time
        if first:
            self.first_token_time = now
        self.last_token_time = now
        return (now - self.arrival_time if first else None), gap


def merge_updates(updates: list[RequestUpdate]) -> RequestUpdate:
    """Several queued updates as one (per sample: text and tokens concatenated, the last finish reason)."""
    if len(updates) == 1:
        return updates[0]
    merged: dict[int, SampleDelta] = {}
    for update in updates:
        for delta in update.deltas:
            if delta.index in merged:
                merged[delta.index].extend(delta)
            else:
                merged[delta.index] = SampleDelta(delta.index, delta.text, list(delta.token_ids),
                                                  None if delta.logprobs is None else list(delta.logprobs),
                                                  delta.finish_reason, delta.stop_reason, delta.prompt_logprobs)
    last = updates[-1]
    return RequestUpdate(list(merged.values()), last.finished, last.output, last.error, last.status, True)


class CommandSender:
    """The commands a transport carries to its engine loop, as ``(name, argument)`` tuples; ``_send`` delivers."""

    def _send(self, command: tuple) -> None:
        raise NotImplementedError

    def add(self, requests: list[NewRequest]) -> None:
        """Queue a batch: the loop adds all of it before its next step (one batch, not one request per step)."""
        self._send(("add", requests))

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (a finished or unknown id is ignored)."""
        self._send(("abort", request_id))

    def abort_all(self, message: str) -> None:
        """End every request in flight with a 503 error (their streams close cleanly)."""
        self._send(("abort_all", message))
