"""OpenAI-shaped response bodies and stream chunks, from engine outputs and deltas (pure functions)."""
from __future__ import annotations

import json
from typing import Any

from nanocore.engine.outputs import Logprob
from nanocore.serve.request_state import SampleDelta
from nanocore.serve.tool_fields import ToolPlan
from nanocore.serve.tool_output import ToolCallStream, tool_finish_reason, whole_message


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token_text(token_id: int, entry: Logprob) -> str:
    return entry.decoded_token if entry.decoded_token is not None else f"token_id:{token_id}"


def _ranked(entries: dict[int, Logprob], top_n: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(entries.items(), key=lambda item: item[1].rank if item[1].rank is not None else 1 << 30)
    return ranked[:top_n]


def completion_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]] | None, top_n: int,
                        text_offset: int = 0) -> dict[str, Any] | None:
    """The legacy completions format: tokens, token_logprobs, top_logprobs, text_offset."""
    if logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token_id, entries in zip(token_ids, logprobs):
        text = _token_text(token_id, entries[token_id])
        tokens.append(text)
        token_logprobs.append(entries[token_id].logprob)
        top.append({_token_text(t, e): e.logprob for t, e in _ranked(entries, top_n)})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]] | None,
                  top_n: int) -> dict[str, Any] | None:
    """The chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}]}``."""
    if logprobs is None:
        return None

    def item(token_id: int, entry: Logprob) -> dict[str, Any]:
        text = _token_text(token_id, entry)
        return {"token": text, "logprob": entry.logprob, "bytes": list(text.encode("utf-8"))}

    content = [{**item(t, entries[t]), "top_logprobs": [item(i, e) for i, e in _ranked(entries, top_n)]}
               for t, entries in zip(token_ids, logprobs)]
    return {"content": content}


class ResponseShape:
    """Ids, names and the completion / chat body layouts of one API call."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str, top_logprobs: int,
                 tools: ToolPlan | None = None):
        self.chat, self.id, self.created, self.model = chat, request_id, created, model
        self.top_logprobs = top_logprobs
        self.tool_parser = tools.parser if tools is not None else None  # None: the output is content only
        self.max_calls = tools.max_calls if tools is not None else None

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def logprobs(self, token_ids: list[int], logprobs, text_offset: int = 0) -> dict[str, Any] | None:
        if self.chat:
            return chat_logprobs(token_ids, logprobs, self.top_logprobs)
        return completion_logprobs(token_ids, logprobs, self.top_logprobs, text_offset)

    def body(self, choices: list[tuple[int, Any]], usage_counts: dict[str, int]) -> dict[str, Any]:
        """The whole response; ``choices`` are (index, CompletionOutput)."""
        rows = []
        for index, out in choices:
            row: dict[str, Any] = {"index": index, "logprobs": self.logprobs(out.token_ids, out.logprobs),
                                   "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            if self.chat and self.tool_parser is not None:
                row["message"], called = whole_message(self.tool_parser, out.text, self.max_calls)
                row["finish_reason"] = tool_finish_reason(out.finish_reason, called)
            elif self.chat:
                row["message"] = {"role": "assistant", "content": out.text}
            else:
                row["text"] = out.text
            rows.append(row)
        return {**self._envelope("chat.completion" if self.chat else "text_completion", rows), "usage": usage_counts}

    def tool_stream(self) -> ToolCallStream | None:
        """The tool call state of one streamed choice (None when the output is content only)."""
        return ToolCallStream(self.tool_parser, self.max_calls) if self.tool_parser is not None else None

    def delta_chunks(self, index: int, delta: SampleDelta, tools: ToolCallStream | None, role: bool,
                     text_offset: int) -> list[dict[str, Any]]:
        """The chunks of one engine delta of one choice: its content, then one chunk per tool call delta."""
        text, calls, finish = delta.text, [], delta.finish_reason
        if tools is not None:
            text, calls = tools.feed(delta.text, finish is not None)
            finish = tool_finish_reason(finish, tools.called)
        first = self.chunk(index, text, delta.token_ids, delta.logprobs, None if calls[1:] else finish, role=role,
                           text_offset=text_offset, tool_calls=calls[:1])
        rest = [self.chunk(index, None, [], None, finish if n == len(calls) - 1 else None, tool_calls=[call])
                for n, call in enumerate(calls[1:], start=1)]
        return [first, *rest]

    def chunk(self, index: int, text: str | None, token_ids: list[int], logprobs, finish_reason: str | None,
              role: bool = False, text_offset: int = 0, tool_calls: list[dict[str, Any]] = ()) -> dict[str, Any]:
        """One stream chunk for one choice (chat: ``delta``; the first one of a choice carries the role).
        ``text_offset``: characters of this choice streamed before (completions logprobs count from there)."""
        row: dict[str, Any] = {"index": index, "finish_reason": finish_reason,
                               "logprobs": self.logprobs(token_ids, logprobs, text_offset) if token_ids else None}
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
