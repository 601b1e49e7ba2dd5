"""A character-level pushdown automaton for JSON documents that satisfy a JSON schema (a subset), for the reference
structured-output backend.

States are immutable tuples (a stack of frames), so trying a token from a state copies nothing. The automaton is
exact on its subset: ``feed`` accepts a character iff some completion of the text still parses and validates.
Subset: ``type`` (a name or a list), ``properties``, ``required``, ``additionalProperties`` (a bool or a schema),
``items``, ``enum`` / ``const`` of strings, numbers, booleans and null; annotations are ignored, other keywords
refused. Without additional properties a key comes at most once; whitespace is free, as JSON allows.
"""
from __future__ import annotations

import json

import regex

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples"})
KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "const"})
WHITESPACE = " \t\n\r"
NUMBER = regex.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
INTEGER = regex.compile(r"-?(?:0|[1-9][0-9]*)")
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
END = (("end",),)
LITERALS = {"boolean": frozenset({"true", "false"}), "null": frozenset({"null"})}


class Node:
    """One compiled schema: the JSON types it admits and the constraints on each."""

    __slots__ = ("types", "properties", "required", "additional", "items", "strings", "literals")

    def __init__(self, types=TYPES, properties=None, required=frozenset(), additional=None, items=None,
                 strings=None, literals=None):
        self.types, self.properties, self.required = frozenset(types), properties or {}, frozenset(required)
        self.additional, self.items = additional, items  # additional None: no keys beyond properties
        self.strings, self.literals = strings, literals  # an enum: allowed strings, allowed texts of the rest


def any_value() -> Node:
    node = Node()
    node.additional = node.items = node
    return node


def compile_schema(schema, where: str = "schema") -> Node:
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON object, got {schema!r}")
    unknown = sorted(set(schema) - KEYWORDS - ANNOTATIONS)
    if unknown:
        raise ValueError(f"the reference structured-output backend does not support {unknown} (at {where}); it "
                         f"reads {sorted(KEYWORDS)}")
    types = schema.get("type", sorted(TYPES))
    types = frozenset([types] if isinstance(types, str) else types)
    if not types or not types <= TYPES:
        raise ValueError(f"{where}: type must be one of {sorted(TYPES)} or a list of them, got {schema['type']!r}")
    node = Node(types)
    if "enum" in schema or "const" in schema:
        restrict_to_enum(node, schema["enum"] if "enum" in schema else [schema["const"]], where)
    node.properties = {k: compile_schema(v, f"{where}.properties.{k}") for k, v in schema.get("properties", {}).items()}
    node.required = frozenset(schema.get("required", []))
    additional = schema.get("additionalProperties", True)
    node.additional = any_value() if additional is True else None if additional is False else compile_schema(
        additional, f"{where}.additionalProperties")
    if node.additional is None and not node.required <= set(node.properties):
        raise ValueError(f"{where}: required {sorted(node.required - set(node.properties))} are not properties and "
                         f"additionalProperties is false: no object can satisfy it")
    node.items = compile_schema(schema["items"], f"{where}.items") if "items" in schema else any_value()
    return node


def restrict_to_enum(node: Node, values: list, where: str) -> None:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: enum must be a non-empty list")
    if any(isinstance(v, (dict, list)) for v in values):
        raise ValueError(f"{where}: the reference backend supports enum values that are strings, numbers, booleans "
                         f"or null, not objects or arrays")
    kept = [v for v in values if enum_type(v) & node.types]
    if not kept:
        raise ValueError(f"{where}: no enum value has one of the types {sorted(node.types)}")
    node.strings = frozenset(v for v in kept if isinstance(v, str))
    node.literals = frozenset(json.dumps(v) for v in kept if not isinstance(v, str))


def enum_type(value) -> set[str]:
    """The schema types a JSON value satisfies (1 and 1.0 are integers, as JSON Schema says)."""
    if isinstance(value, bool):
        return {"boolean"}
    if value is None:
        return {"null"}
    if isinstance(value, str):
        return {"string"}
    return {"number", "integer"} if float(value).is_integer() else {"number"}


def start(root: Node) -> tuple:
    return END + (("val", root),)


def feed(stack: tuple, ch: str) -> tuple | None:
    """The state after ``ch``, or None if no completion of the text can satisfy the schema."""
    frame, rest = stack[-1], stack[:-1]
    kind = frame[0]
    if kind == "end":
        return stack if ch in WHITESPACE else None
    if kind == "val":
        return stack if ch in WHITESPACE else start_value(rest, frame[1], ch)
    if kind == "str":
        return feed_string(rest, frame, ch)
    if kind in ("num", "lit"):
        text = frame[2] + ch
        if frame_viable(kind, frame[1], text, partial=True):
            return rest + ((kind, frame[1], text),)
        return feed(done(rest, None), ch) if frame_viable(kind, frame[1], frame[2], partial=False) else None
    if kind == "obj":
        return feed_object(rest, frame, ch)
    return feed_array(rest, frame, ch)


def frame_viable(kind: str, spec, text: str, partial: bool) -> bool:
    if kind == "lit":
        return any(c.startswith(text) for c in spec) if partial else text in spec
    return bool(text) and (INTEGER if spec else NUMBER).fullmatch(text, partial=partial) is not None


def start_value(rest: tuple, node: Node, ch: str) -> tuple | None:
    if node.strings is not None or node.literals is not None:  # an enum
        if ch == '"':
            return rest + (("str", node.strings, "", ""),) if node.strings else None
        return feed(rest + (("lit", node.literals, ""),), ch)
    if ch == '"' and "string" in node.types:
        return rest + (("str", None, "", ""),)
    if ch == "{" and "object" in node.types:
        return rest + (("obj", node, frozenset(), "key_or_end", None),)
    if ch == "[" and "array" in node.types:
        return rest + (("arr", node.items, "first"),)
    if ch in "-0123456789" and node.types & {"number", "integer"}:
        return feed(rest + (("num", "number" not in node.types, ""),), ch)
    literals = frozenset(LITERALS[t] for t in ("boolean", "null") if t in node.types)
    return feed(rest + (("lit", frozenset().union(*literals), ""),), ch) if literals else None


def feed_string(rest: tuple, frame: tuple, ch: str) -> tuple | None:
    _, allowed, decoded, escape = frame
    if escape == "\\":
        if ch == "u":
            return rest + (("str", allowed, decoded, "u"),)
        return string_char(rest, allowed, decoded, ESCAPES[ch]) if ch in ESCAPES else None
    if escape:  # "u" and the hex digits so far
        if ch not in "0123456789abcdefABCDEF":
            return None
        if len(escape) == 4:
            return string_char(rest, allowed, decoded, chr(int(escape[1:] + ch, 16)))
        digits = (escape[1:] + ch).lower()
        if allowed is not None and not any(f"{ord(c):04x}".startswith(digits) for c in next_chars(allowed, decoded)):
            return None
        return rest + (("str", allowed, decoded, escape + ch),)
    if ch == '"':
        return done(rest, decoded) if allowed is None or decoded in allowed else None
    if ch == "\\":
        return rest + (("str", allowed, decoded, "\\"),) if allowed is None or next_chars(allowed, decoded) else None
    return string_char(rest, allowed, decoded, ch) if ch >= " " else None


def next_chars(allowed, decoded: str) -> set[str]:
    """Characters that may follow ``decoded`` in one of the ``allowed`` strings."""
    return {a[len(decoded)] for a in allowed if len(a) > len(decoded) and a.startswith(decoded)}


def string_char(rest: tuple, allowed, decoded: str, ch: str) -> tuple | None:
    decoded += ch
    if allowed is not None and not any(a.startswith(decoded) for a in allowed):
        return None
    return rest + (("str", allowed, decoded, ""),)


def keys_left(node: Node, seen: frozenset) -> frozenset | None:
    """Property names a next key may take (None: any string)."""
    return None if node.additional is not None else frozenset(node.properties) - seen


def feed_object(rest: tuple, frame: tuple, ch: str) -> tuple | None:
    _, node, seen, phase, key = frame
    if ch in WHITESPACE:
        return rest + (frame,)
    if phase == "colon":
        if ch != ":":
            return None
        child = node.properties.get(key, node.additional)
        return rest + (("obj", node, seen | {key}, "comma_or_end", None), ("val", child))
    if ch == "}" and phase in ("key_or_end", "comma_or_end"):
        return done(rest, None) if node.required <= seen else None
    if ch == "," and phase == "comma_or_end":
        return rest + (("obj", node, seen, "key", None),) if keys_left(node, seen) != frozenset() else None
    if ch == '"' and phase in ("key_or_end", "key"):
        allowed = keys_left(node, seen)
        return rest + (frame, ("str", allowed, "", "")) if allowed != frozenset() else None
    return None


def feed_array(rest: tuple, frame: tuple, ch: str) -> tuple | None:
    _, items, phase = frame
    if ch in WHITESPACE:
        return rest + (frame,)
    if ch == "]" and phase in ("first", "comma_or_end"):
        return done(rest, None)
    if ch == "," and phase == "comma_or_end":
        return rest + (("arr", items, "value"),)
    if phase in ("first", "value"):
        return feed(rest + (("arr", items, "comma_or_end"), ("val", items)), ch)
    return None


def done(stack: tuple, value) -> tuple:
    """The parent's state once a value (or a key, for an object awaiting one) is complete."""
    frame = stack[-1]
    if frame[0] == "obj" and frame[3] in ("key_or_end", "key"):
        return stack[:-1] + (("obj", frame[1], frame[2], "colon", value),)
    return stack


def is_complete(stack: tuple) -> bool:
    """The text so far is a whole document satisfying the schema."""
    if stack == END:
        return True
    frame = stack[-1]
    return stack[:-1] == END and frame[0] in ("num", "lit") and frame_viable(frame[0], frame[1], frame[2], False)


def partial_char_ok(stack: tuple, tail: bytes) -> bool:
    """Some character whose UTF-8 encoding starts with ``tail`` (incomplete) may come next."""
    frame = stack[-1]
    if frame[0] != "str" or frame[3]:
        return False  # outside a string JSON is ASCII
    allowed, decoded = frame[1], frame[2]
    if allowed is None:
        return True
    return any(c.encode().startswith(tail) for c in next_chars(allowed, decoded))
