"""Tool calls in chat responses: the message of a whole output, and the deltas of a streamed one.

Streamed calls come as vLLM sends them: for each call, once its text is complete, a delta with its ``index``,
``id``, ``type`` and ``function.name`` (arguments ``""``), then a delta with its whole ``function.arguments``.
Content outside the calls streams as it comes, except an end that could start a call, held until it is decided.
``finish_reason`` "stop" becomes "tool_calls" when the output held calls.
"""
from __future__ import annotations

import secrets
from typing import Any

from nanocore.serve.tool_parsers import ParsedCall, ToolParser


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def tool_finish_reason(finish_reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and finish_reason == "stop" else finish_reason


def whole_message(parser: ToolParser, text: str, max_calls: int | None) -> tuple[dict[str, Any], bool]:
    """(the assistant message, whether it holds calls) of a whole output."""
    content, calls = parser.parse(text)
    calls = calls[:max_calls]
    if not calls:
        return {"role": "assistant", "content": text}, False
    tool_calls = [{"id": call_id(), "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}} for call in calls]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, True


class ToolCallStream:
    """One streamed choice: text deltas in, (new content, tool call deltas) out. Re-parses the text so far on each
    delta (a find per marker for hermes), so what it sends is exactly what the whole output parses to."""

    def __init__(self, parser: ToolParser, max_calls: int | None):
        self.parser, self.max_calls = parser, max_calls
        self.text, self.sent_chars, self.sent_calls = "", 0, 0

    @property
    def called(self) -> bool:
        return self.sent_calls > 0

    def feed(self, text: str, final: bool) -> tuple[str | None, list[dict[str, Any]]]:
        self.text += text
        segments = self.parser.segments(self.text, final)
        content = "".join(s for s in segments if isinstance(s, str))
        calls = [s for s in segments if isinstance(s, ParsedCall)][:self.max_calls]
        new_content, self.sent_chars = content[self.sent_chars:], len(content)
        deltas = []
        for index, call in enumerate(calls[self.sent_calls:], start=self.sent_calls):
            deltas.append({"index": index, "id": call_id(), "type": "function",
                           "function": {"name": call.name, "arguments": ""}})
            deltas.append({"index": index, "function": {"arguments": call.arguments}})
        self.sent_calls = len(calls)
        if self.called and not new_content.strip():
            new_content = ""  # the line breaks around calls are not content
        return new_content or None, deltas
