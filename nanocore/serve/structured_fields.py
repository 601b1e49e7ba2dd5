"""Request fields that shape the output through token masks: OpenAI's ``response_format`` and ``logit_bias``,
vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` and ``structured_outputs``.

Each becomes ``SamplingParams.structured_output`` (a ``Constraint``) or ``SamplingParams.logit_bias``. A request may
constrain its output one way only; two constraining fields get a 400 naming both. A schema is always enforced
(``strict`` or not); the engine's structured output backend compiles it, and a constraint it cannot compile is
answered with a 400 too.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import regex

from nanocore.interfaces.structured_output import Constraint
from nanocore.serve.protocol import bad_request

#: vLLM's guided_* fields -> the constraint kind each gives
GUIDED_FIELDS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}
#: keys of vLLM's ``structured_outputs`` object -> the constraint kind each gives
STRUCTURED_OUTPUTS_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                           "json_object": "json_object"}
#: keys of ``structured_outputs`` that would change how the output is constrained; only their neutral value is taken
STRUCTURED_OUTPUTS_UNSUPPORTED = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                                  "whitespace_pattern", "structural_tag")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
MAX_BIAS = 100.0


def mapped_fields(body: Any, vocab_size: int | None, more: list[tuple[str, Constraint]] = ()) -> dict[str, Any]:
    """The SamplingParams fields ``structured_output`` and ``logit_bias`` of a request body."""
    return {"structured_output": constraint_of(body, more),
            "logit_bias": logit_bias_of(getattr(body, "logit_bias", None), vocab_size)}


def constraint_of(body: Any, more: list[tuple[str, Constraint]] = ()) -> Constraint | None:
    """The one constraint a request body's fields give (``more``: (field, constraint) from elsewhere: tools)."""
    fields = {name: getattr(body, name, None) for name in ("response_format", "structured_outputs", *GUIDED_FIELDS)}
    found: list[tuple[str, Constraint]] = []
    if fields.get("response_format") is not None:
        constraint = from_response_format(fields["response_format"])
        if constraint is not None:
            found.append(("response_format", constraint))
    for name, kind in GUIDED_FIELDS.items():
        if fields.get(name) is not None:
            found.append((name, make(kind, fields[name], name)))
    if fields.get("structured_outputs") is not None:
        found.extend(from_structured_outputs(fields["structured_outputs"]))
    found.extend(more)
    if len(found) > 1:
        names = [name for name, _ in found]
        raise bad_request(f"{' and '.join(names)} each constrain the output; send only one of them", names[0])
    return found[0][1] if found else None


def make(kind: str, value: Any, param: str) -> Constraint:
    """A constraint of ``kind`` from a request value, or a 400 naming ``param`` that says what to send."""
    _check_value(kind, value, param)
    try:
        if kind == "json_schema":
            return Constraint.json_schema(value)
        if kind == "choice":
            return Constraint.choice(value)
        return Constraint(kind, None if kind == "json_object" else value)
    except ValueError as exc:
        raise bad_request(f"{param}: {exc}", param) from None


def _check_value(kind: str, value: Any, param: str) -> None:
    if kind == "json_schema" and not isinstance(value, (dict, str)):
        raise bad_request(f"{param} must be a JSON schema (an object), got {_shown(value)}", param)
    if kind == "choice" and not (isinstance(value, list) and all(isinstance(c, str) for c in value)):
        raise bad_request(f"{param} must be a list of strings, got {_shown(value)}", param)
    if kind == "regex":
        if not isinstance(value, str):
            raise bad_request(f"{param} must be a regular expression (a string), got {_shown(value)}", param)
        _check_pattern(value, param)


def _check_pattern(pattern: str, param: str) -> None:
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise bad_request(f"{param}: the regular expression {pattern!r} does not compile: {exc}", param) from None


def from_response_format(value: Any) -> Constraint | None:
    """OpenAI's ``{"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema, strict}}``."""
    param = "response_format"
    if not isinstance(value, dict) or value.get("type") not in RESPONSE_FORMAT_TYPES:
        raise bad_request(f"response_format must be an object whose type is one of {list(RESPONSE_FORMAT_TYPES)}, "
                          f"got {_shown(value)}", param)
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return Constraint("json_object")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise bad_request('response_format of type json_schema needs "json_schema": {"name": ..., "schema": '
                          '{...}} with the schema as a JSON object', param)
    if not isinstance(spec.get("name", ""), str) or not isinstance(spec.get("strict", False), (bool, type(None))):
        raise bad_request("response_format.json_schema: name must be a string and strict a boolean", param)
    return make("json_schema", spec["schema"], "response_format.json_schema.schema")


def from_structured_outputs(value: Any) -> list[tuple[str, Constraint]]:
    """vLLM's ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`` (one of them)."""
    if not isinstance(value, dict):
        raise bad_request(f"structured_outputs must be an object with one of the keys "
                          f"{list(STRUCTURED_OUTPUTS_KEYS)}, got {_shown(value)}", "structured_outputs")
    unknown = sorted(set(value) - set(STRUCTURED_OUTPUTS_KEYS) - set(STRUCTURED_OUTPUTS_UNSUPPORTED))
    if unknown:
        raise bad_request(f"structured_outputs has unknown keys {unknown}; the keys are "
                          f"{list(STRUCTURED_OUTPUTS_KEYS)}", "structured_outputs")
    for key in STRUCTURED_OUTPUTS_UNSUPPORTED:
        if value.get(key) not in (None, False, ""):
            raise bad_request(f"structured_outputs.{key} is not supported by nanocore (it would change the "
                              f"output); leave it out", "structured_outputs")
    found = []
    for key, kind in STRUCTURED_OUTPUTS_KEYS.items():
        given = value.get(key)
        if given is None or (kind == "json_object" and given is False):
            continue
        if kind == "json_object" and given is not True:
            raise bad_request(f"structured_outputs.json_object must be true or false, got {_shown(given)}",
                              "structured_outputs")
        found.append((f"structured_outputs.{key}", make(kind, given, f"structured_outputs.{key}")))
    return found


def logit_bias_of(value: Any, vocab_size: int | None) -> dict[int, float] | None:
    """OpenAI's ``{"token id": bias}`` (ids as strings, biases in [-100, 100]) as ``{id: bias}``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"logit_bias must be an object mapping token ids to biases, got {_shown(value)}",
                          "logit_bias")
    bias = {}
    for key, number in value.items():
        token_id = _token_id(key)
        if token_id is None or (vocab_size is not None and token_id >= vocab_size):
            bound = f"in [0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise bad_request(f"logit_bias keys must be token ids {bound} for this model, got {key!r}", "logit_bias")
        real = isinstance(number, numbers.Real) and not isinstance(number, bool) and math.isfinite(number)
        if not real or not -MAX_BIAS <= number <= MAX_BIAS:
            raise bad_request(f"logit_bias values must be numbers in [-100, 100], got {number!r} for token "
                              f"{key!r}", "logit_bias")
        bias[token_id] = float(number)
    return bias or None


def _token_id(key: Any) -> int | None:
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return None


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
