"""The structured-output kind: constraints, the reference backend's exact masks, registration, config, ``auto``."""
from __future__ import annotations

import pytest

from nanocore.config import EngineConfig
from nanocore.interfaces import KINDS, Constraint, StructuredOutputBackend, TokenVocabulary
from nanocore.plugins import BackendError, reload_registry
from nanocore.toolkit.reference import ReferenceStructuredOutput
from nanocore.toolkit.token_bitmask import allocate_token_bitmask, unpack_bitmask

TOKENS = [b"", b"{", b"}", b'"', b"a", b":", b" ", b"1", b",", b"\xe6", b"\x97\xa5", b"\xe6\x97", b"\\u00", b"6",
          b"1", b"b", b"-", b".", b"e", b"true", b"null", b"[", b"]", b"\xc3", b"\xa9"]
VOCABULARY = TokenVocabulary(tuple(TOKENS), 40, (0,))


def allowed_after(constraint: Constraint, text: list[bytes]) -> set[bytes]:
    backend = ReferenceStructuredOutput(VOCABULARY)
    matcher = backend.matcher(backend.compile(constraint))
    for piece in text:
        assert matcher.accept_token(TOKENS.index(piece)), f"{piece!r} refused after {text}"
    mask = allocate_token_bitmask(1, VOCABULARY.vocab_size)
    matcher.fill_bitmask(mask)
    return {TOKENS[t] if t else b"<stop>" for t in unpack_bitmask(mask[0], VOCABULARY.vocab_size).nonzero().flatten().tolist()}


SCHEMA = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"enum": ["é", 1]},
                                 "b": {"type": "string"}}, "required": ["a"], "additionalProperties": False})


def test_keys_are_prefixes_of_the_properties_left_and_escapes_must_spell_them():
    assert allowed_after(SCHEMA, [b"{", b'"']) == {b"a", b"b", b"\\u00"}  # \u0061 spells "a"
    assert allowed_after(SCHEMA, [b"{", b'"', b"\\u00", b"6"]) == {b"1"}  # \u0061 only: a key must be a property
    second_key = [b"{", b'"', b"a", b'"', b":", b"1", b",", b'"', b"a"]
    assert allowed_after(SCHEMA, second_key) == {b"b", b"\\u00"}  # "a" was given already: only "ab" remains


def test_enum_strings_and_split_characters():
    after_colon = [b"{", b'"', b"a", b"b", b'"', b":"]
    assert allowed_after(SCHEMA, after_colon) == {b" ", b'"', b"1"}  # "é" or 1
    assert allowed_after(SCHEMA, after_colon + [b'"']) == {b"\xc3", b"\\u00"}  # é starts with byte c3
    assert allowed_after(SCHEMA, after_colon + [b'"', b"\xc3"]) == {b"\xa9"}
    free = [b"{", b'"', b"b", b'"', b":", b'"']
    assert {b"\xe6", b"\xe6\x97", b"\xc3"} <= allowed_after(SCHEMA, free)
    assert allowed_after(SCHEMA, free + [b"\xe6"]) == {b"\x97\xa5", b"\xa9"}  # continuation bytes only


def test_required_key_gates_the_closing_brace_and_numbers_end_cleanly():
    assert b"}" not in allowed_after(SCHEMA, [b"{"])
    after_int = allowed_after(SCHEMA, [b"{", b'"', b"a", b'"', b":", b"-", b"1"])
    assert after_int == {b"1", b"6", b",", b"}", b" "}  # integers take no '.' or exponent
    assert allowed_after(SCHEMA, [b"{", b'"', b"a", b'"', b":", b"1", b"}"]) == {b" ", b"<stop>"}


def test_regex_and_choice():
    assert allowed_after(Constraint("regex", r"[a-b]+-?[0-9]"), [b"a"]) == {b"a", b"b", b"-", b"1", b"6"}
    assert allowed_after(Constraint("regex", r"[0-9]+"), [b"1"]) == {b"1", b"6", b"<stop>"}
    assert allowed_after(Constraint("regex", r"\w"), []) >= {b"\xe6", b"\xc3", b"a"}  # split letters may start \w
    assert b"\xe6" not in allowed_after(Constraint("regex", r"[a-z]"), [])
    assert allowed_after(Constraint.choice(["ab", "a1", "é"]), [b"a"]) == {b"b", b"1"}
    assert allowed_after(Constraint.choice(["ab", "é"]), []) == {b"a", b"\xc3"}


def test_rollback_restores_and_refuses_more_than_was_accepted():
    backend = ReferenceStructuredOutput(VOCABULARY)
    matcher = backend.matcher(backend.compile(Constraint("json_object")))
    assert matcher.accept_token(1) and matcher.accept_token(2) and matcher.accept_token(0) and matcher.is_terminated()
    matcher.rollback(2)
    assert not matcher.is_terminated() and matcher.accept_token(3)
    with pytest.raises(ValueError, match="cannot roll back 5 tokens: 2 were accepted"):
        matcher.rollback(5)


@pytest.mark.parametrize("make, message", [
    (lambda: Constraint("yaml", "x"), "unknown constraint kind 'yaml'"),
    (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
    (lambda: Constraint.json_schema([1]), "must be a JSON object"),
    (lambda: Constraint.choice([]), "non-empty tuple"),
    (lambda: Constraint("regex", ""), "non-empty string"),
    (lambda: Constraint("json_object", "{}"), "takes no value"),
    (lambda: TokenVocabulary((b"a",), 4, ()), "at least one stop token"),
    (lambda: ReferenceStructuredOutput(VOCABULARY).compile(Constraint.json_schema({"minimum": 3})), "minimum"),
    (lambda: ReferenceStructuredOutput(VOCABULARY).compile(Constraint("grammar", "root ::= 'a'")), "grammar"),
    (lambda: ReferenceStructuredOutput(VOCABULARY).compile(Constraint.json_schema(
        {"required": ["x"], "properties": {}, "additionalProperties": False})), "no object can satisfy it"),
])
def test_bad_constraints_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_equal_schemas_are_one_cache_key():
    assert Constraint.json_schema({"b": 1, "a": 2}) == Constraint.json_schema('{"a": 2, "b": 1}')
    assert len({Constraint.json_schema({"type": "object"}), Constraint.json_schema({"type": "object"})}) == 1


def test_kind_is_registered_and_configurable():
    assert KINDS["structured_output"] == (StructuredOutputBackend, "nanocore_structured_output_backends")
    assert EngineConfig().backend("structured_output") == ("auto", {})
    config = EngineConfig(structured_output="reference", structured_output_options={"x": 1})
    assert config.backend("structured_output") == ("reference", {"x": 1})
    with pytest.raises(ValueError, match="unknown structured_output 'nope'"):
        EngineConfig(structured_output="nope")


def test_auto_never_picks_the_reference(monkeypatch):
    try:
        monkeypatch.setenv("NANOCORE_PLUGINS", "no-such-plugin")  # the builtins only
        with pytest.raises(BackendError, match="no installed structured_output supports cpu"):
            reload_registry().resolve("structured_output", "auto", "cpu")
        monkeypatch.delenv("NANOCORE_PLUGINS")
        registry = reload_registry()
        if len(registry.names("structured_output")) > 1:
            assert registry.resolve("structured_output", "auto", "cpu").name != "reference"
    finally:
        monkeypatch.delenv("NANOCORE_PLUGINS", raising=False)
        reload_registry()
