"""OpenAI-shaped response bodies and stream chunks, from engine outputs and deltas (pure functions)."""
from __future__ import annotations

import json
from typing import Any

from nanocore.engine.outputs import Logprob
from nanocore.serve.tool_fields import ToolPlan
from nanocore.serve.tool_output import ToolCallStream, tool_finish_reason, whole_message


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


#: what a -inf logprob (a token masked out or filtered away) is sent as: JSON has no infinity, and vLLM sends -9999
LOWEST_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, LOWEST_LOGPROB)


def _token_text(token_id: int, entry: Logprob) -> str:
    return entry.decoded_token if entry.decoded_token is not None else f"token_id:{token_id}"


def _ranked(entries: dict[int, Logprob], top_n: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(entries.items(), key=lambda item: item[1].rank if item[1].rank is not None else 1 << 30)
    return ranked[:top_n]


def completion_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob] | None] | None, top_n: int,
                        text_offset: int = 0, first_token: str = "") -> dict[str, Any] | None:
    """The legacy completions format: tokens, token_logprobs, top_logprobs, text_offset. An entry None (an echoed
    prompt's first token, which nothing predicts) has the text ``first_token`` and null logprobs."""
    if logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token_id, entries in zip(token_ids, logprobs):
        if entries is None:
            text, logprob, top_entry = first_token, None, None
        else:
            text, logprob = _token_text(token_id, entries[token_id]), _finite(entries[token_id].logprob)
            top_entry = {_token_text(t, e): _finite(e.logprob) for t, e in _ranked(entries, top_n)}
        tokens.append(text)
        token_logprobs.append(logprob)
        top.append(top_entry)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def prompt_logprobs_body(prompt_logprobs: list[dict[int, Logprob] | None] | None,
                         top_n: int) -> list[dict[str, Any] | None] | None:
    """vLLM's ``prompt_logprobs``: None for the first token, then per token {id: {logprob, rank, decoded_token}}
    holding the prompt token (first) and the ``top_n`` most likely."""
    if prompt_logprobs is None:
        return None
    return [None if entries is None else {
        str(t): {"logprob": _finite(e.logprob), "rank": e.rank, "decoded_token": e.decoded_token}
        for i, (t, e) in enumerate(entries.items()) if i == 0 or e.rank <= top_n} for entries in prompt_logprobs]


def echoed(prompt_token_ids: list[int], prompt_logprobs, text: str, token_ids: list[int], logprobs,
           prompt_text: str) -> tuple[str, list[int], list | None]:
    """A completion (or its first stream chunk) with the prompt before it: text, token ids, logprobs if asked."""
    if logprobs is not None:
        logprobs = [None, *prompt_logprobs[1:], *logprobs]
    return prompt_text + text, [*prompt_token_ids, *token_ids], logprobs


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]] | None,
                  top_n: int) -> dict[str, Any] | None:
    """The chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}]}``."""
    if logprobs is None:
        return None

    def item(token_id: int, entry: Logprob) -> dict[str, Any]:
        text = _token_text(token_id, entry)
        return {"token": text, "logprob": _finite(entry.logprob), "bytes": list(text.encode("utf-8"))}

    content = [{**item(t, entries[t]), "top_logprobs": [item(i, e) for i, e in _ranked(entries, top_n)]}
               for t, entries in zip(token_ids, logprobs)]
    return {"content": content}


class ResponseShape:
    """Ids, names and the completion / chat body layouts of one API call.

    ``tools``: how a chat output is read for tool calls (None: content only); ``echo``: per prompt, (its text, its
    first token's text) to put before each of its ``n`` completions; ``prompt_logprobs``: the top N of the
    ``prompt_logprobs`` the body carries (None: it carries none)."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str, top_logprobs: int,
                 tools: ToolPlan | None = None, echo: list[tuple[str, str]] | None = None, n: int = 1,
                 prompt_logprobs: int | None = None):
        self.chat, self.id, self.created, self.model = chat, request_id, created, model
        self.top_logprobs, self.echo, self.n, self.prompt_logprobs = top_logprobs, echo, n, prompt_logprobs
        self.tool_parser = tools.parser if tools is not None else None  # None: the output is content only
        self.max_calls = tools.max_calls if tools is not None else None

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def logprobs(self, token_ids: list[int], logprobs, text_offset: int = 0,
                 first_token: str = "") -> dict[str, Any] | None:
        if self.chat:
            return chat_logprobs(token_ids, logprobs, self.top_logprobs)
        return completion_logprobs(token_ids, logprobs, self.top_logprobs, text_offset, first_token)

    def echo_of(self, index: int) -> tuple[str, str]:
        """(prompt text, first token's text) of choice ``index``."""
        return self.echo[index // self.n]

    def body(self, choices: list[tuple[int, Any, Any]], usage_counts: dict[str, int]) -> dict[str, Any]:
        """The whole response; ``choices`` are (index, CompletionOutput, its RequestOutput)."""
        rows = []
        for index, out, request in choices:
            text, token_ids, logprobs, first_token = out.text, out.token_ids, out.logprobs, ""
            if self.echo is not None:
                prompt_text, first_token = self.echo_of(index)
                text, token_ids, logprobs = echoed(request.prompt_token_ids, request.prompt_logprobs, text,
                                                   token_ids, logprobs, prompt_text)
            row: dict[str, Any] = {"index": index, "logprobs": self.logprobs(token_ids, logprobs, 0, first_token),
                                   "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            if self.chat and self.tool_parser is not None:
                row["message"], called = whole_message(self.tool_parser, text, self.max_calls)
                row["finish_reason"] = tool_finish_reason(out.finish_reason, called)
            elif self.chat:
                row["message"] = {"role": "assistant", "content": text}
            else:
                row["text"] = text
            if self.prompt_logprobs is not None and not self.chat:
                row["prompt_logprobs"] = prompt_logprobs_body(request.prompt_logprobs, self.prompt_logprobs)
            rows.append(row)
        body = {**self._envelope("chat.completion" if self.chat else "text_completion", rows), "usage": usage_counts}
        if self.prompt_logprobs is not None and self.chat:  # one prompt: vLLM puts them beside the choices
            body["prompt_logprobs"] = prompt_logprobs_body(choices[0][2].prompt_logprobs, self.prompt_logprobs)
        return body

    def tool_stream(self) -> ToolCallStream | None:
        """The tool call state of one streamed choice (None when the output is content only)."""
        return ToolCallStream(self.tool_parser, self.max_calls) if self.tool_parser is not None else None

    def delta_chunks(self, index: int, piece: tuple[str, list[int], Any], finish: str | None,
                     tools: ToolCallStream | None, role: bool, text_offset: int,
                     first_token: str = "") -> list[dict[str, Any]]:
        """The chunks of one engine delta of one choice, ``piece`` its (text, token ids, logprobs) after any echo:
        its content, then one chunk per tool call delta."""
        (text, token_ids, logprobs), calls = piece, []
        if tools is not None:
            text, calls = tools.feed(text, finish is not None)
            finish = tool_finish_reason(finish, tools.called)
        first = self.chunk(index, text, token_ids, logprobs, None if calls[1:] else finish, role=role,
                           text_offset=text_offset, tool_calls=calls[:1], first_token=first_token)
        rest = [self.chunk(index, None, [], None, finish if n == len(calls) - 1 else None, tool_calls=[call])
                for n, call in enumerate(calls[1:], start=1)]
        return [first, *rest]

    def chunk(self, index: int, text: str | None, token_ids: list[int], logprobs, finish_reason: str | None,
              role: bool = False, text_offset: int = 0, tool_calls: list[dict[str, Any]] = (),
              first_token: str = "") -> dict[str, Any]:
        """One stream chunk for one choice (chat: ``delta``; the first one of a choice carries the role).
        ``text_offset``: characters of this choice streamed before (completions logprobs count from there)."""
        row: dict[str, Any] = {"index": index, "finish_reason": finish_reason, "logprobs": self.logprobs(
            token_ids, logprobs, text_offset, first_token) if token_ids else None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = list(tool_calls)
            row["delta"] = delta
        else:
            row["text"] = text or ""
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [row])

    def usage_chunk(self, usage_counts: dict[str, int]) -> dict[str, Any]:
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion", []),
                "usage": usage_counts}
