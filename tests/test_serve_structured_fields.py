"""response_format, guided_*, structured_outputs and logit_bias through the real `openai` client: each maps to the
SamplingParams the engine gets, and each bad value or conflict is a 400 naming the field."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import openai_client, running_server, tiny_llm  # noqa: E402

from nanocore.interfaces.structured_output import Constraint  # noqa: E402

MODEL = "tiny"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city"], "additionalProperties": False}
#: a grammar the spied engine refuses as a structured output backend's compile would (a ValueError)
UNCOMPILABLE = 'root ::= undefined_rule'


def spy_on_requests(llm) -> list:
    """The SamplingParams of every request the engine is given. The engine runs each without its constraint and
    bias, so these tests check the mapping whatever the engine does with masks."""
    seen, add = [], llm.engine.add_request

    def spied(prompt, params, **kwargs):
        seen.append(params)
        constraint = params.structured_output
        if constraint is not None and constraint.kind == "grammar" and "undefined_rule" in constraint.value:
            raise ValueError("the grammar does not compile: rule 'undefined_rule' is not defined")
        return add(prompt, dataclasses.replace(params, structured_output=None, logit_bias=None), **kwargs)

    llm.engine.add_request = spied
    return seen


@pytest.fixture(scope="module")
def server():
    """(client, params seen by the engine): random weights at tiny shapes (vocab 512), prompts as token ids."""
    llm = tiny_llm(max_model_len=256)
    seen = spy_on_requests(llm)
    with running_server(llm, served_model_name=MODEL) as (url, _):
        yield openai_client(url), seen


def complete(client, **fields):
    return client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2, extra_body=fields)


@pytest.mark.parametrize("fields, constraint", [
    ({"response_format": {"type": "json_object"}}, Constraint("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}},
     Constraint.json_schema(SCHEMA)),
    ({"response_format": {"type": "text"}}, None),
    ({"guided_json": SCHEMA}, Constraint.json_schema(SCHEMA)),
    ({"guided_json": json.dumps(SCHEMA)}, Constraint.json_schema(SCHEMA)),
    ({"guided_regex": r"\d{3}-[a-z]+"}, Constraint("regex", r"\d{3}-[a-z]+")),
    ({"guided_choice": ["yes", "no"]}, Constraint("choice", ("yes", "no"))),
    ({"guided_grammar": 'root ::= "a" | "b"'}, Constraint("grammar", 'root ::= "a" | "b"')),
    ({"structured_outputs": {"json": SCHEMA}}, Constraint.json_schema(SCHEMA)),
    ({"structured_outputs": {"regex": "a+"}}, Constraint("regex", "a+")),
    ({"structured_outputs": {"choice": ["x", "y", "z"]}}, Constraint("choice", ("x", "y", "z"))),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, Constraint("grammar", 'root ::= "a"')),
    ({"structured_outputs": {"json_object": True}}, Constraint("json_object")),
    ({"structured_outputs": {"json_object": False, "disable_any_whitespace": False}}, None),
    ({}, None),
])
def test_each_field_maps_to_the_constraint(server, fields, constraint):
    client, seen = server
    response = complete(client, **fields)
    assert response.usage.completion_tokens == 2 or response.choices[0].finish_reason == "stop"
    assert seen[-1].structured_output == constraint and seen[-1].logit_bias is None


def test_logit_bias_maps_to_token_ids(server):
    client, seen = server
    client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=1, logit_bias={"5": 10, "511": -100, "7": 0.5})
    assert seen[-1].logit_bias == {5: 10.0, 511: -100.0, 7: 0.5}
    client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=1, logit_bias={})
    assert seen[-1].logit_bias is None


def bad(call, *words: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param, error
    for word in words:
        assert word in error["message"], error["message"]


@pytest.mark.parametrize("fields, param, words", [
    ({"response_format": {"type": "xml"}}, "response_format", ["json_schema"]),
    ({"response_format": "json"}, "response_format", ["must be an object"]),
    ({"response_format": {"type": "json_schema"}}, "response_format", ['"schema"']),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}}, "response_format",
     ["JSON object"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}}, "response_format",
     ["name must be a string"]),
    ({"guided_json": 5}, "guided_json", ["JSON schema"]),
    ({"guided_json": "{not json"}, "guided_json", ["not valid JSON"]),
    ({"guided_json": "[1, 2]"}, "guided_json", ["must be a JSON object"]),
    ({"guided_regex": "(ab"}, "guided_regex", ["does not compile"]),
    ({"guided_regex": 7}, "guided_regex", ["regular expression"]),
    ({"guided_choice": []}, "guided_choice", ["non-empty"]),
    ({"guided_choice": ["a", 1]}, "guided_choice", ["list of strings"]),
    ({"guided_choice": "a"}, "guided_choice", ["list of strings"]),
    ({"guided_grammar": ""}, "guided_grammar", ["non-empty string"]),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs.json",
     ["structured_outputs.json and structured_outputs.regex", "only one"]),
    ({"structured_outputs": {"pattern": "a"}}, "structured_outputs", ["unknown keys ['pattern']"]),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}}, "structured_outputs",
     ["disable_any_whitespace", "not supported"]),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs", ["true or false"]),
    ({"structured_outputs": ["json"]}, "structured_outputs", ["must be an object"]),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "response_format",
     ["response_format and guided_regex", "only one"]),
    ({"guided_choice": ["a"], "structured_outputs": {"json_object": True}}, "guided_choice",
     ["guided_choice and structured_outputs.json_object"]),
    ({"guided_grammar": UNCOMPILABLE}, None, ["does not compile", "undefined_rule"]),
])
def test_bad_values_and_conflicts_are_400_naming_the_field(server, fields, param, words):
    client, _ = server
    bad(lambda: complete(client, **fields), *words, param=param)


@pytest.mark.parametrize("bias, words", [
    ({"abc": 1}, ["token ids in [0, 512)", "'abc'"]),
    ({"-1": 1}, ["token ids in [0, 512)"]),
    ({"512": 1}, ["token ids in [0, 512)", "'512'"]),
    ({"5": 101}, ["[-100, 100]", "101"]),
    ({"5": -100.5}, ["[-100, 100]"]),
    ({"5": "high"}, ["[-100, 100]"]),
    ({"5": True}, ["[-100, 100]"]),
    ([5], ["must be an object"]),
])
def test_bad_logit_bias_is_400(server, bias, words):
    client, _ = server
    bad(lambda: client.completions.create(model=MODEL, prompt=[1], max_tokens=1, extra_body={"logit_bias": bias}),
        *words, param="logit_bias")


def test_the_server_keeps_serving_after_refusals(server):
    client, seen = server
    bad(lambda: complete(client, guided_regex="("), "does not compile", param="guided_regex")
    ok = complete(client, guided_regex="[ab]+")
    assert ok.choices[0].index == 0 and seen[-1].structured_output == Constraint("regex", "[ab]+")
