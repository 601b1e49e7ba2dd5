"""Request fields nanocore does not implement: refused when they would change the output, accepted when not.

A field outside the declared request models lands here. One that would change the output (``NOT_IMPLEMENTED``)
gets a 400 naming it, unless it holds its neutral value (``best_of: 1``, ``modalities: ["text"]``);
one that does not (``NO_EFFECT``) is accepted; any other is logged once as a warning, as vLLM does.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from nanocore.serve.protocol import bad_request

logger = logging.getLogger("nanocore.serve")


def _unset(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == "" or value == [] or value == {}


def _one(value: Any) -> bool:
    return value is None or value == 1


def _no_tool(value: Any) -> bool:
    return value is None or value == "none"


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


def _true(value: Any) -> bool:
    return value is None or value is True


#: field -> (whether its value leaves the output as nanocore makes it, what to send instead)
NOT_IMPLEMENTED = {
    "best_of": (_one, "leave it out or at 1"),
    "echo": (_unset, "leave it false (chat completions do not echo; /v1/completions does)"),
    "suffix": (_unset, "leave it out"),
    "presence_penalty": (_unset, "leave it at 0"),
    "frequency_penalty": (_unset, "leave it at 0"),
    "repetition_penalty": (_one, "leave it at 1"),
    "functions": (_unset, "leave it out"),
    "tools": (_unset, "tools are served on /v1/chat/completions"),
    "tool_choice": (_no_tool, "tools are served on /v1/chat/completions"),
    "function_call": (_no_tool, 'leave it out or send "none"'),
    "modalities": (_text_only, 'leave it out or send ["text"]'),
    "audio": (_unset, "leave it out"),
    "prediction": (_unset, "leave it out"),
    "reasoning_effort": (_unset, "leave it out"),
    "web_search_options": (_unset, "leave it out"),
    "guided_decoding_backend": (_unset, "leave it out (the server's --structured-output backend is used)"),
    "guided_whitespace_pattern": (_unset, "leave it out"),
    "use_beam_search": (_unset, "leave it false"),
    "length_penalty": (_one, "leave it at 1"),
    "truncate_prompt_tokens": (_unset, "leave it out"),
    "allowed_token_ids": (_unset, "leave it out"),
    "bad_words": (_unset, "leave it out"),
    "logits_processors": (_unset, "leave it out"),
    "return_tokens_as_token_ids": (_unset, "leave it false"),
    "spaces_between_special_tokens": (_true, "leave it true"),
    "continue_final_message": (_unset, "leave it false"),
    "chat_template": (_unset, "leave it out (the model's own template is used)"),
    "documents": (_unset, "leave it out"),
    "mm_processor_kwargs": (_unset, "leave it out"),
}

#: fields that never change the output: accepted and not used
NO_EFFECT = frozenset({"user", "store", "metadata", "service_tier", "priority",
                       "request_id", "cache_salt", "prompt_cache_key", "safety_identifier"})


class FieldCheck:
    """Checks a request's undeclared fields; remembers which unknown names it warned about (once each)."""

    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, extra: dict[str, Any] | None) -> None:
        for name, value in (extra or {}).items():
            if name in NOT_IMPLEMENTED:
                neutral, hint = NOT_IMPLEMENTED[name]
                if not neutral(value):
                    raise bad_request(f"{name} is not supported by nanocore (it would change the output); {hint}",
                                      name)
            elif name not in NO_EFFECT:
                self._warn_once(name)

    def _warn_once(self, name: str) -> None:
        with self._lock:
            if name in self._warned:
                return
            self._warned.add(name)
        logger.warning("ignoring the unknown request field %r (not part of the API nanocore serves); "
                       "this is logged once per field", name)
