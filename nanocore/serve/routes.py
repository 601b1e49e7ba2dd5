"""The routes that read prompts: completions, chat completions, and vLLM's tokenize / detokenize."""
from __future__ import annotations

import secrets
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nanocore.serve.generation import generate
from nanocore.serve.openapi import errors
from nanocore.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    bad_request,
)
from nanocore.serve.responses import ResponseShape
from nanocore.serve.structured_fields import mapped_fields
from nanocore.serve.tool_fields import check_tools, plan_tools

GENERATION_RESPONSES = {200: {"content": {"text/event-stream": {}},
                              "description": "The completion (JSON), or server-sent events with stream=true"},
                        **errors(400, 401, 404, 413, 429, 500, 503)}


def add_generation_routes(app: FastAPI, state, auth) -> None:
    """``state`` is the app's ``ServerState``; ``auth`` the API-key dependency."""

    @app.post("/v1/completions", dependencies=[auth], responses=GENERATION_RESPONSES)
    async def completions(body: CompletionRequest, raw: Request):
        state.check_model(body.model)
        state.check_fields(body.model_extra)
        params = body.sampling_params(body.max_tokens, body.logprobs, body.num_prompt_logprobs(),
                                     **mapped_fields(body, state.vocab_size))
        state.check_n(params.n)
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        texts = body.prompts()
        prompts = await state.prompts.completion_prompts(texts, body.max_tokens, add_special)
        echo = await state.prompts.off_loop(state.prompts.echo_texts, texts, prompts) if body.echo else None
        shape = ResponseShape(False, f"cmpl-{secrets.token_hex(12)}", int(time.time()), state.served_model_name,
                              params.logprobs or 0, echo=echo, n=params.n, prompt_logprobs=body.prompt_logprobs)
        return await generate(state.client, prompts, params, shape, body.stream, body.include_usage, raw)

    @app.post("/v1/chat/completions", dependencies=[auth], responses=GENERATION_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        state.check_model(body.model)
        state.check_fields(body.model_extra)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, state.tool_parser)
        forced = [("tool_choice", tools.constraint)] if tools.constraint is not None else []
        params = body.sampling_params(max_tokens, body.num_logprobs(), **mapped_fields(body, state.vocab_size, forced))
        state.check_n(params.n)
        messages = [m.template_dict() for m in body.messages]
        prompt = await state.prompts.chat_prompt(messages, max_tokens, body.add_generation_prompt,
                                                 body.chat_template_kwargs, bool(body.add_special_tokens), tools.tools)
        shape = ResponseShape(True, f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), state.served_model_name,
                              params.logprobs or 0, tools, prompt_logprobs=body.prompt_logprobs)
        return await generate(state.client, [prompt], params, shape, body.stream, body.include_usage, raw)

    @app.post("/tokenize", dependencies=[auth], responses=errors(400, 401, 404, 413))
    async def tokenize(body: TokenizeRequest):
        state.check_model(body.model)
        prompts = state.prompts
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give either prompt (a string) or messages (a chat conversation)", "prompt")
        if body.prompt is not None:
            add_special = True if body.add_special_tokens is None else body.add_special_tokens
            token_ids = await prompts.off_loop(prompts.encode, body.prompt, add_special, "prompt")
        else:
            messages = [m.template_dict() for m in body.messages]
            tools = body.tools if check_tools(body.tools) else None
            text = await prompts.off_loop(prompts.render_chat, messages, body.add_generation_prompt,
                                          body.chat_template_kwargs, tools)
            token_ids = await prompts.off_loop(prompts.encode, text, bool(body.add_special_tokens), "messages")
        token_strs = prompts.token_strs(token_ids) if body.return_token_strs else None
        # a JSONResponse: FastAPI's own encoder walks a long id list in Python (seconds for 500k ids)
        return JSONResponse({"count": len(token_ids), "max_model_len": state.max_model_len, "tokens": token_ids,
                             "token_strs": token_strs})

    @app.post("/detokenize", dependencies=[auth], responses=errors(400, 401, 404, 413))
    async def detokenize(body: DetokenizeRequest):
        state.check_model(body.model)
        return {"prompt": await state.prompts.detokenize(body.tokens)}
