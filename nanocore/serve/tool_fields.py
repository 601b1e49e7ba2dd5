"""A chat request's ``tools`` and ``tool_choice``: what the chat template renders, what constrains the output, and
which parser finds the calls in it.

- ``"none"``: the tools are rendered, the output is content only.
- ``"auto"`` (the default with tools): the model decides; the server's tool call parser (``--tool-call-parser``)
  finds calls written in the model family's format.
- ``"required"`` and ``{"type": "function", "function": {"name": ...}}``: a JSON schema constraint makes the model
  write the call(s) as JSON: a non-empty array of ``{"name": ..., "arguments": {...}}`` (required), or that one
  object with the name fixed (named). The arguments follow each function's ``parameters`` schema. JSON schema is
  the one constraint kind every structured output backend declares, so this works with any of them that reads
  the schema keywords used (``const``; for required also ``anyOf`` with several tools and ``minItems``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import regex

from nanocore.interfaces.structured_output import Constraint
from nanocore.serve.protocol import bad_request
from nanocore.serve.structured_fields import make
from nanocore.serve.tool_parsers import ForcedParser, ToolParser

TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_NAME = regex.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_SHAPE = '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}'
#: ``parameters`` left out: a function without parameters
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]] | None  # for the chat template (None: render no tools)
    constraint: Constraint | None  # required / named: the calls as JSON
    parser: ToolParser | None  # finds the calls in the output (None: content only)
    max_calls: int | None = None  # parallel_tool_calls=false: the first call only


NO_TOOLS = ToolPlan(None, None, None)


def plan_tools(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None,
               family_parser: ToolParser | None) -> ToolPlan:
    """The plan for a request's tools, or a 400 that says what to send."""
    functions = check_tools(tools)
    if not functions:
        if tool_choice not in (None, "none"):
            raise bad_request("tool_choice needs tools: send the functions the model may call in tools", "tool_choice")
        return NO_TOOLS
    choice = "auto" if tool_choice is None else tool_choice
    max_calls = 1 if parallel_tool_calls is False else None
    if choice == "none":
        return ToolPlan(tools, None, None)
    if choice == "auto":
        if family_parser is None:
            raise bad_request('this server has no tool call parser for its model, so tool_choice "auto" cannot '
                              'find calls; start it with --tool-call-parser (hermes or llama3_json), or send '
                              'tool_choice "required" or a named function', "tool_choice")
        return ToolPlan(tools, None, family_parser, max_calls)
    if choice == "required":
        calls = [call_schema(name, schema) for name, schema in functions.items()]
        items = calls[0] if len(calls) == 1 else {"anyOf": calls}
        array = {"type": "array", "items": items, "minItems": 1, **({"maxItems": 1} if max_calls == 1 else {})}
        return ToolPlan(tools, make("json_schema", array, "tools"), ForcedParser(), max_calls)
    name = named_choice(choice, functions)
    return ToolPlan(tools, make("json_schema", call_schema(name, functions[name]), "tools"), ForcedParser(), 1)


def check_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """``{name: parameters schema}`` of OpenAI's tools list (empty when there are none)."""
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise bad_request(f"tools must be a list of {TOOL_SHAPE}", "tools")
    functions: dict[str, dict[str, Any]] = {}
    for position, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"tools[{position}] must be {TOOL_SHAPE}", "tools")
        name, parameters = function["name"], function.get("parameters", NO_PARAMETERS)
        if not FUNCTION_NAME.fullmatch(name):
            raise bad_request(f"tools[{position}]: a function name is 1 to 64 letters, digits, '_' or '-', got "
                              f"{name!r}", "tools")
        if name in functions:
            raise bad_request(f"tools[{position}]: the function name {name!r} is given twice", "tools")
        if not isinstance(parameters, dict):
            raise bad_request(f"tools[{position}].function.parameters must be a JSON schema (an object)", "tools")
        functions[name] = parameters
    return functions


def named_choice(choice: Any, functions: dict[str, dict[str, Any]]) -> str:
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f'tool_choice must be one of {list(TOOL_CHOICES)} or {{"type": "function", "function": '
                          f'{{"name": ...}}}}, got {choice!r}', "tool_choice")
    if function["name"] not in functions:
        raise bad_request(f"tool_choice names the function {function['name']!r}, which is not in tools "
                          f"({sorted(functions)})", "tool_choice")
    return function["name"]


def call_schema(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """One call of function ``name`` as a JSON object."""
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}
