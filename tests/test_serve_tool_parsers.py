"""Tool call parsers (hermes, llama3_json, forced), their streamed deltas, the parser choice, and the tools plan."""
from __future__ import annotations

import json

import pytest

from nanocore.interfaces.structured_output import Constraint
from nanocore.serve.protocol import APIError
from nanocore.serve.tool_fields import NO_PARAMETERS, call_schema, plan_tools
from nanocore.serve.tool_output import ToolCallStream, tool_finish_reason, whole_message
from nanocore.serve.tool_parsers import (
    ForcedParser,
    HermesParser,
    Llama3JsonParser,
    ParsedCall,
    choose_parser,
)

WEATHER = ParsedCall("get_weather", '{"city": "Paris", "unit": "celsius"}')
TIME = ParsedCall("get_time", '{"zone": "CET"}')
HERMES_TWO = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
              '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
LLAMA_TWO = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
             '{"name": "get_time", "parameters": {"zone": "CET"}}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}]


def test_hermes_finds_each_call_and_keeps_the_text_around_them():
    assert HermesParser().parse(HERMES_TWO) == ("Let me check.", [WEATHER, TIME])
    assert HermesParser().parse("No tools needed: 4.") == ("No tools needed: 4.", [])
    only = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    assert HermesParser().parse(only) == (None, [TIME])


def test_hermes_malformed_call_is_returned_as_text():
    broken = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> bye'
    assert HermesParser().parse(broken) == (broken, [])
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    assert HermesParser().parse(no_name) == (no_name, [])
    mixed = HERMES_TWO.replace('"zone": "CET"}}', '"zone": "CET"')  # the second call's JSON is cut short
    content, calls = HermesParser().parse(mixed)
    assert calls == [WEATHER] and content.startswith("Let me check.") and '"get_time"' in content


def test_hermes_unterminated_call_at_the_end_still_parses():
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n'
    assert HermesParser().parse(text) == (None, [TIME])
    assert HermesParser().parse(text + "</tool_") == (None, [TIME])


def test_llama3_json_calls_with_and_without_python_tag():
    assert Llama3JsonParser().parse(LLAMA_TWO) == (None, [WEATHER, TIME])
    single = ' {"name": "get_time", "parameters": {"zone": "CET"}}'
    assert Llama3JsonParser().parse(single) == (None, [TIME])
    assert Llama3JsonParser().parse("Paris is sunny.") == ("Paris is sunny.", [])


def test_llama3_json_malformed_or_not_a_call_is_text():
    assert Llama3JsonParser().parse('{"name": "get_time", "parameters": {') == ('{"name": "get_time", "parameters": {',
                                                                                 [])
    assert Llama3JsonParser().parse('{"answer": 42}') == ('{"answer": 42}', [])
    assert Llama3JsonParser().parse('Use {"name": "x", "parameters": {}}') == ('Use {"name": "x", "parameters": {}}', [])


def test_forced_parser_reads_an_object_or_an_array_of_calls():
    named = '{"name": "get_time", "arguments": {"zone": "CET"}}'
    assert ForcedParser().parse(named) == (None, [TIME])
    required = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
                           {"name": "get_time", "arguments": {"zone": "CET"}}])
    assert ForcedParser().parse(required) == (None, [WEATHER, TIME])
    assert ForcedParser().parse("[]") == ("[]", [])
    assert ForcedParser().parse('{"name": "get_time"') == ('{"name": "get_time"', [])


def test_arguments_given_as_json_text_are_accepted_and_other_types_are_not():
    text = '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}</tool_call>'
    assert HermesParser().parse(text) == (None, [TIME])
    listed = '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>'
    assert HermesParser().parse(listed) == (listed, [])


def stream_all(parser, text: str, step: int, max_calls=None):
    """(content, tool call deltas) of ``text`` streamed ``step`` characters at a time."""
    stream, content, deltas = ToolCallStream(parser, max_calls), "", []
    for start in range(0, len(text), step):
        new, calls = stream.feed(text[start:start + step], start + step >= len(text))
        content += new or ""
        deltas += calls
    return content, deltas, stream.called


def assemble(deltas) -> list[tuple[str, str, str]]:
    """(id, name, arguments) per call index, as a client accumulates streamed tool call deltas."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        call = calls.setdefault(delta["index"], {"id": None, "name": "", "arguments": ""})
        call["id"] = delta.get("id", call["id"])
        call["name"] += delta["function"].get("name", "")
        call["arguments"] += delta["function"].get("arguments", "")
    return [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("parser, text", [(HermesParser(), HERMES_TWO), (Llama3JsonParser(), LLAMA_TWO)])
@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_streamed_deltas_add_up_to_the_whole_parse(parser, text, step):
    content, deltas, called = stream_all(parser, text, step)
    whole_content, whole_calls = parser.parse(text)
    assert called and content.strip() == (whole_content or "")
    calls = assemble(deltas)
    assert [(name, arguments) for _, name, arguments in calls] == [(c.name, c.arguments) for c in whole_calls]
    assert all(call_id.startswith("call_") for call_id, _, _ in calls) and len({c[0] for c in calls}) == 2


def test_stream_sends_name_first_then_arguments_and_holds_a_possible_marker():
    stream = ToolCallStream(HermesParser(), None)
    assert stream.feed("Checking <tool", False) == ("Checking ", [])  # "<tool" may start a call: held
    assert stream.feed("_call>\n{\"name\": \"get_time\", ", False) == (None, [])
    content, deltas = stream.feed('"arguments": {"zone": "CET"}}\n</tool_call>', True)
    assert content is None and [set(d) for d in deltas] == [{"index", "id", "type", "function"}, {"index", "function"}]
    assert deltas[0]["function"] == {"name": "get_time", "arguments": ""} and deltas[0]["type"] == "function"
    assert deltas[1] == {"index": 0, "function": {"arguments": '{"zone": "CET"}'}}
    held = ToolCallStream(HermesParser(), None)
    assert held.feed("a <tool", False) == ("a ", []) and held.feed("box", True) == ("<toolbox", [])


def test_malformed_streamed_call_becomes_content():
    text = 'x <tool_call>{"name": oops}</tool_call>'
    content, deltas, called = stream_all(HermesParser(), text, 3)
    assert content == text and deltas == [] and not called


def test_whole_message_and_finish_reason():
    message, called = whole_message(HermesParser(), HERMES_TWO, None)
    assert called and message["content"] == "Let me check." and len(message["tool_calls"]) == 2
    assert message["tool_calls"][0]["function"] == {"name": WEATHER.name, "arguments": WEATHER.arguments}
    assert message["tool_calls"][0]["type"] == "function" and message["tool_calls"][0]["id"].startswith("call_")
    first_only, _ = whole_message(HermesParser(), HERMES_TWO, 1)
    assert [c["function"]["name"] for c in first_only["tool_calls"]] == ["get_weather"]
    plain, called = whole_message(HermesParser(), "Just text.", None)
    assert plain == {"role": "assistant", "content": "Just text."} and not called
    assert tool_finish_reason("stop", True) == "tool_calls" and tool_finish_reason("length", True) == "length"
    assert tool_finish_reason("stop", False) == "stop"


def test_parser_choice_by_option_template_and_architecture():
    assert choose_parser("llama3_json", "<tool_call>", []).name == "llama3_json"
    assert choose_parser("auto", "... <tool_call> ...", ["LlamaForCausalLM"]).name == "hermes"
    assert choose_parser("auto", "{{ '<|python_tag|>' }}", []).name == "llama3_json"
    assert choose_parser("auto", None, ["Qwen3ForCausalLM"]).name == "hermes"
    assert choose_parser("auto", "plain", ["LlamaForCausalLM"]).name == "llama3_json"
    assert choose_parser("auto", "plain", ["GPT2LMHeadModel"]) is None
    with pytest.raises(ValueError, match="unknown tool call parser 'mistral'"):
        choose_parser("mistral", None, [])


def test_tools_plan_per_tool_choice():
    hermes = HermesParser()
    assert plan_tools(None, None, None, hermes).tools is None
    auto = plan_tools(TOOLS, None, None, hermes)
    assert auto.tools == TOOLS and auto.constraint is None and auto.parser is hermes
    none = plan_tools(TOOLS, "none", None, hermes)
    assert none.tools == TOOLS and none.constraint is None and none.parser is None
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}, None, None)
    assert named.constraint == Constraint.json_schema(call_schema("get_time", NO_PARAMETERS))
    assert isinstance(named.parser, ForcedParser) and named.max_calls == 1
    required = plan_tools(TOOLS, "required", None, None)
    schema = required.constraint.schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    assert schema["items"]["anyOf"] == [call_schema("get_weather", TOOLS[0]["function"]["parameters"]),
                                        call_schema("get_time", NO_PARAMETERS)]
    one = plan_tools(TOOLS[:1], "required", False, None).constraint.schema
    assert one["items"] == call_schema("get_weather", TOOLS[0]["function"]["parameters"]) and one["maxItems"] == 1
    assert plan_tools(TOOLS, "auto", False, hermes).max_calls == 1


@pytest.mark.parametrize("tools, choice, parser, words", [
    (None, "required", None, "tool_choice needs tools"),
    (TOOLS, "auto", None, "--tool-call-parser"),
    (TOOLS, "sometimes", None, "tool_choice must be one of"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "not in tools"),
    ({"type": "function"}, None, HermesParser(), "tools must be a list"),
    ([{"type": "function", "function": {"name": "bad name!"}}], None, HermesParser(), "1 to 64 letters"),
    ([{"type": "retrieval"}], None, HermesParser(), "tools[0] must be"),
    (TOOLS + TOOLS[:1], None, HermesParser(), "given twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], None, HermesParser(), "JSON schema"),
])
def test_tools_errors_say_what_to_send(tools, choice, parser, words):
    with pytest.raises(APIError) as caught:
        plan_tools(tools, choice, None, parser)
    assert caught.value.status == 400 and words in caught.value.message
    assert caught.value.param in ("tools", "tool_choice")
