"""Tool calls out of generated text, one parser per model family's format.

- ``hermes`` (Qwen2 / Qwen3, Hermes, and any template that writes ``<tool_call>``): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; text around the blocks is content.
- ``llama3_json`` (Llama 3.1+): the output is ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``, several joined by ``;``; an output that does not start with ``{`` is content.
- ``forced``: what ``tool_choice`` "required" (a JSON array of calls) or a named function (one call object) makes
  the model write under its constraint, whatever the family.

A parser splits text into segments: content strings and ``ParsedCall``s. A block that is not a well-formed call
(malformed JSON, no name) stays in the content as the model wrote it. With ``final=False`` (streaming) a parser
returns only the segments no later text can change: a possible start of a call is held back.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


Segment = str | ParsedCall


def call_from(obj: Any, arguments_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall | None:
    """``{"name": str, "arguments" | "parameters": object or its JSON text}`` as a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = next((obj[key] for key in arguments_keys if key in obj), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def held_back(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ToolParser(ABC):
    name: ClassVar[str]

    @abstractmethod
    def segments(self, text: str, final: bool) -> list[Segment]:
        """Content strings and calls, in order; with ``final=False`` only those later text cannot change."""

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls) of a whole output: content is the text outside the calls (None if empty)."""
        segments = self.segments(text, final=True)
        calls = [s for s in segments if isinstance(s, ParsedCall)]
        content = "".join(s for s in segments if isinstance(s, str))
        if calls:
            content = content.strip()
        return content or None, calls


class HermesParser(ToolParser):
    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def segments(self, text: str, final: bool) -> list[Segment]:
        segments: list[Segment] = []
        position = 0
        while True:
            start = text.find(self.start, position)
            if start < 0:
                tail = text[position:]
                segments.append(tail if final else tail[:len(tail) - held_back(tail, self.start)])
                break
            segments.append(text[position:start])
            end = text.find(self.end, start)
            if end < 0 and not final:
                break
            stop = len(text) if end < 0 else end + len(self.end)
            body = text[start + len(self.start):end if end >= 0 else len(text)]
            if end < 0:  # the output stopped inside the call, perhaps inside its closing tag
                body = body[:len(body) - held_back(body, self.end)]
            segments.append(self._call(body) or text[start:stop])
            position = stop
        return [s for s in segments if s != ""]

    @staticmethod
    def _call(body: str) -> ParsedCall | None:
        try:
            return call_from(json.loads(body))
        except json.JSONDecodeError:
            return None


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    python_tag = "<|python_tag|>"

    def segments(self, text: str, final: bool) -> list[Segment]:
        stripped = text.lstrip()
        tagged = stripped.startswith(self.python_tag)
        if tagged:
            stripped = stripped[len(self.python_tag):].lstrip()
        if not stripped and (tagged or not final):
            return []  # nothing yet, or the tag alone
        if not final and not tagged and self.python_tag.startswith(stripped):
            return []  # perhaps the start of the tag
        if not stripped.startswith("{"):
            return [text] if text else []
        segments: list[Segment] = []
        decoder, position = json.JSONDecoder(), 0
        while position < len(stripped):
            try:
                obj, end = decoder.raw_decode(stripped, position)
            except json.JSONDecodeError:
                if final:
                    segments.append(stripped[position:])
                break
            segments.append(call_from(obj) or stripped[position:end])
            position = self._after_separator(stripped, end)
        return segments

    @staticmethod
    def _after_separator(text: str, end: int) -> int:
        rest = text[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        return len(text) - len(rest)


class ForcedParser(ToolParser):
    """The output a ``tool_choice`` constraint gives: one call object (named) or an array of calls (required)."""

    name = "forced"

    def segments(self, text: str, final: bool) -> list[Segment]:
        if not final:
            return []
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return [text] if text else []
        calls = [call_from(v, ("arguments",)) for v in (value if isinstance(value, list) else [value])]
        if not calls or None in calls:
            return [text]
        return calls


PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}
#: HF architectures whose models write tool calls in one family's format
ARCHITECTURE_PARSERS = {"Qwen2ForCausalLM": "hermes", "Qwen3ForCausalLM": "hermes", "Qwen2MoeForCausalLM": "hermes",
                        "Qwen3MoeForCausalLM": "hermes", "LlamaForCausalLM": "llama3_json"}
TOOL_CALL_PARSER_CHOICES = ("auto", *PARSERS)


def choose_parser(option: str, chat_template: str | None, architectures: list[str]) -> ToolParser | None:
    """The parser ``--tool-call-parser`` names; ``auto``: the one whose markers the chat template writes, else the
    one of the model's architecture, else None (tool_choice "auto" is then refused)."""
    if option not in TOOL_CALL_PARSER_CHOICES:
        raise ValueError(f"unknown tool call parser {option!r}; choose one of {list(TOOL_CALL_PARSER_CHOICES)}")
    if option != "auto":
        return PARSERS[option]()
    template = chat_template or ""
    if HermesParser.start in template:
        return HermesParser()
    if Llama3JsonParser.python_tag in template:
        return Llama3JsonParser()
    name = next((ARCHITECTURE_PARSERS[a] for a in architectures if a in ARCHITECTURE_PARSERS), None)
    return PARSERS[name]() if name else None
