"""The output processor: detokenization, stop detection and the outputs a request returns.

It reads sequences and never writes them: a stop it detects (EOS / stop ids, stop strings, length, as vLLM)
goes back to the scheduler, which applies it.
"""
from __future__ import annotations

import logging

from nanocore.engine.detokenizer import IncrementalDetokenizer
from nanocore.engine.outputs import Logprob, RequestOutput, logprob_dict, request_output
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.sequence import Sequence

logger = logging.getLogger("nanocore")

Stop = tuple[str, int | str | None]  # (finish reason, stop reason)
#: how an "error" stop reason starts when the request's own fields caused it (the server answers 400, not 500)
INVALID_REQUEST = "invalid request: "


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: set[int], max_model_len: int, requests: dict):
        """``requests``: the engine's requests by id (each holds its detokenizers, one per sequence)."""
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.requests = requests

    def detokenizer(self, prompt_token_ids: list[int], params: SamplingParams,
                    stream: bool) -> IncrementalDetokenizer | None:
        """A sequence's incremental detokenizer when it streams or has stop strings (else it decodes once)."""
        if (stream or params.stop_strings) and self.tokenizer is not None:
            return IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                          params.stop_strings, params.include_stop_str_in_output)
        return None

    def stop_of(self, seq: Sequence) -> Stop | None:
        """Whether ``seq``'s newest token ends it: EOS / stop ids (not in the text), stop strings, length.
        A failing detokenizer ends only its own sequence, with reason "error"."""
        params, token_id = seq.sampling_params, seq.token_ids[-1]
        detokenizer = self.requests[seq.request_id].detokenizers[seq.index]
        stop = None
        # most tokens are neither EOS nor a stop id and have no text to check: only the length test remains
        if detokenizer is not None or token_id in params.stop_token_ids or (
                not params.ignore_eos and token_id in self.eos_token_ids):
            try:
                stop = self._token_stop(seq, detokenizer, token_id)
            except Exception as exc:  # one request's detokenizer must not take the step down
                logger.exception("request %s: the stop check failed; finishing it with reason 'error'",
                                 seq.request_id)
                return "error", f"{type(exc).__name__}: {exc}"
        if stop is None and seq.reaches_length(seq.num_tokens, self.max_model_len):
            stop = "length", None
        return stop

    def _token_stop(self, seq: Sequence, detokenizer: IncrementalDetokenizer | None, token_id: int) -> Stop | None:
        params = seq.sampling_params
        past_min = seq.num_output_tokens >= params.min_tokens
        if past_min and not params.ignore_eos and token_id in self.eos_token_ids:
            return "stop", None
        if past_min and token_id in params.stop_token_ids:
            return "stop", token_id
        if detokenizer is not None:
            new_text = detokenizer.add_tokens([token_id])
            stop = detokenizer.check_stop(len(new_text)) if past_min else None
            if stop is not None:
                return "stop", stop
        return None

    def request_output(self, request) -> RequestOutput:
        return request_output(request.request_id, request.prompt, request.prompt_token_ids, request.seqs,
                              request.detokenizers, request.finished, self.tokenizer)

    def logprob_dict(self, entry: tuple[list[int], list[float], int]) -> dict[int, Logprob]:
        return logprob_dict(entry, self.tokenizer)
