"""Request bodies of the OpenAI API (the fields nanocore honours) and its error object."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from nanocore.engine.sampling_params import SamplingParams

#: OpenAI caps top logprobs at 20; a larger N would make every step slower for everyone.
MAX_LOGPROBS = 20
#: every stop string is looked for in the new text of every step; OpenAI allows 4
MAX_STOP_STRINGS = 16


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def check_unicode(text: str, param: str) -> None:
    """A lone surrogate (JSON allows the escape "\\ud800") cannot be encoded: say so instead of failing later."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"{param} holds a lone surrogate ({text[exc.start]!r} at character {exc.start}), which "
                          f"is not valid Unicode; send each UTF-16 surrogate pair whole", param) from None


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat (OpenAI's, plus vLLM's extensions top_k, min_p, ignore_eos...)."""

    # other fields are kept in model_extra and judged by request_fields (refused, accepted, or warned about)
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    add_special_tokens: bool | None = None  # vLLM's: BOS and the like around a prompt (completions yes, chat no)
    # checked and mapped by structured_fields (its messages say what to send)
    logit_bias: Any = None
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    prompt_logprobs: int | None = None  # vLLM's: top-N logprobs of every prompt token, in the response

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None,
                        **mapped: Any) -> SamplingParams:
        """``prompt_logprobs``: the top N to compute (echo may need more than the field asks); ``mapped``:
        SamplingParams fields already checked (structured_output, logit_bias)."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise bad_request(f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed", "stop")
        for text in stops:
            check_unicode(text, "stop")
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise bad_request(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}", name)
        if self.prompt_logprobs is not None and self.stream:
            raise bad_request("prompt_logprobs is not available with stream=true; leave it out or set stream "
                              "to false", "prompt_logprobs")
        defaults = SamplingParams()
        try:
            return SamplingParams(
                n=self.n, temperature=_or(self.temperature, 1.0), top_p=_or(self.top_p, 1.0),
                top_k=_or(self.top_k, 0), min_p=_or(self.min_p, 0.0), seed=self.seed, max_tokens=max_tokens,
                min_tokens=self.min_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
                ignore_eos=self.ignore_eos, logprobs=logprobs, skip_special_tokens=self.skip_special_tokens,
                include_stop_str_in_output=self.include_stop_str_in_output,
                prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs, **mapped)
        except ValueError as exc:
            raise bad_request(str(exc), _param_named_in(str(exc), defaults)) from None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


PromptInput = Union[str, list[str], list[int], list[list[int]]]


def _prompt(value: Any) -> PromptInput:
    """The prompt union, checked in one pass (pydantic's union tries each member: 0.6 s on a million ids)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if all(type(t) is int for t in value) or all(type(t) is str for t in value):
            return value
        if all(type(p) is list and all(type(t) is int for t in p) for p in value):
            return value
    raise ValueError("prompt must be a string, a list of strings, a list of token ids or a list of those")


class CompletionRequest(SamplingFields):
    prompt: Annotated[PromptInput, PlainValidator(_prompt, json_schema_input_type=PromptInput)]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False  # the prompt before the completion, in its text and (with logprobs) its logprobs

    def num_prompt_logprobs(self) -> int | None:
        """The top N of prompt logprobs to compute: the field's, or more when echo shows them with logprobs."""
        wanted = [n for n in (self.prompt_logprobs, self.logprobs if self.echo else None) if n is not None]
        return max(wanted) if wanted else None

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt is empty; give a string, a list of strings or a list of token ids", "prompt")
        return list(prompt)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (its content may be null)
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template expects it: text parts joined into one string, tool calls' arguments
        as objects (templates write them with ``tojson``)."""
        content = self.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise bad_request("only text content parts are supported", "messages")
            content = "".join(str(part.get("text", "")) for part in content)
        if (self.model_extra or {}).get("function_call"):
            raise bad_request("messages with function_call are not supported by nanocore; send tool_calls",
                              "messages")
        check_unicode(content or "", "messages")
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.tool_calls:
            if self.role != "assistant":
                raise bad_request(f"only assistant messages carry tool_calls, not {self.role} messages", "messages")
            message["tool_calls"] = [_template_tool_call(call) for call in self.tool_calls]
        message.update({key: getattr(self, key) for key in ("tool_call_id", "name") if getattr(self, key)})
        return message


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict) \
            or not isinstance(function.get("name"), str):
        raise bad_request('each tool call of an assistant message must be {"id": ..., "type": "function", '
                          '"function": {"name": ..., "arguments": "<JSON text>"}}', "messages")
    arguments = function.get("arguments") or "{}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise bad_request(f"the arguments of tool call {function['name']!r} are not valid JSON: {exc}",
                              "messages") from None
    return {**call, "type": "function", "function": {**function, "arguments": arguments}}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Any = None  # checked by tool_fields
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


def _or(value, default):
    return default if value is None else value


def _param_named_in(message: str, defaults: SamplingParams) -> str | None:
    """The field a SamplingParams message starts with (its messages are 'NAME must be ...')."""
    name = message.split(" ", 1)[0]
    return name if hasattr(defaults, name) else None


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One line per problem of a pydantic / FastAPI validation error, and the first field's name."""
    lines, param = [], None
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part != "body"]
        if error.get("type") == "json_invalid":
            lines.append(f"the body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}")
            continue
        field = ".".join(location) or "body"
        param = param or (location[0] if location else None)
        lines.append(f"{field}: {error.get('msg')}")
    return "; ".join(dict.fromkeys(lines)), param


class TokenizeRequest(BaseModel):
    """vLLM's ``POST /tokenize``: a prompt, or chat messages through the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages (as generation does)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Any = None  # rendered by the chat template, as in chat completions
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]
