"""The FastAPI app: OpenAI routes, health, version, metrics, and errors in OpenAI's shape."""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import nanocore
from nanocore.engine.detokenizer import chat_prompt_ids, encode_prompt
from nanocore.serve.async_engine import AsyncEngine
from nanocore.serve.generation import generate
from nanocore.serve.metrics import CONTENT_TYPE
from nanocore.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest, bad_request, validation_message
from nanocore.serve.responses import ResponseShape

logger = logging.getLogger("nanocore.serve")


class ServerState:
    """What the routes need: the engine front (in this process or another), the served name, the API key.

    ``front`` is an ``AsyncEngine`` or an ``EngineProcessFront``: both have ``submit`` / ``abort`` / ``close``,
    ``info`` (``engine_info.describe``), ``tokenizer`` and ``render_metrics``."""

    def __init__(self, front: AsyncEngine, served_model_name: str | None, api_key: str | None,
                 drain_timeout_s: float = 30.0):
        self.front, self.served_model_name = front, served_model_name or front.info["model"]
        self.api_key, self.drain_timeout_s = api_key, drain_timeout_s
        self.backends = front.info["backends"]
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.served_model_name}` (see GET /v1/models)", param="model",
                           code="model_not_found")

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        try:
            return encode_prompt(self.front.tokenizer, prompt)
        except ValueError as exc:
            raise bad_request(f"{exc}", "prompt") from None

    def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        messages = [m.template_dict() for m in body.messages]
        try:
            return chat_prompt_ids(self.front.tokenizer, messages, body.add_generation_prompt,
                                   body.chat_template_kwargs)
        except ValueError as exc:
            raise bad_request(str(exc), "messages") from None
        except Exception as exc:  # a template that rejects these messages (roles, order)
            raise bad_request(f"the chat template rejected these messages: {exc}", "messages") from None

    def check_n(self, n: int) -> None:
        limit = self.front.info["max_num_seqs"]
        if n > limit:
            raise bad_request(f"n = {n} is more samples than the server runs at once (max_num_seqs = {limit})", "n")


def require_api_key(request: Request) -> None:
    key = request.app.state.serve.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key")


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(state.front.close, state.drain_timeout_s)

    app = FastAPI(title="nanocore", version=nanocore.__version__, lifespan=lifespan)
    app.state.serve = state
    add_error_handlers(app)
    add_info_routes(app, state)
    add_generation_routes(app, state)
    return app


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return JSONResponse(bad_request(message, param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), type=kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception):
        logger.exception("unexpected error while serving a request")
        return JSONResponse(APIError(500, f"internal error: {exc}", type="server_error").body(), status_code=500)


def add_info_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health():
        if not state.front.is_alive:
            raise APIError(503, "the engine loop has stopped", type="server_error")
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        info = state.front.info
        return {"version": nanocore.__version__, "model": info["model"], "device": info["device"],
                "served_model_name": state.served_model_name, "backends": state.backends,
                "vocab_size": info["vocab_size"], "max_model_len": info["max_model_len"]}

    @app.get("/metrics")
    async def metrics():
        return Response(await state.front.render_metrics(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=[Depends(require_api_key)])
    async def models():
        card = {"id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "nanocore",
                "root": state.front.info["model"], "max_model_len": state.front.info["max_model_len"]}
        return {"object": "list", "data": [card]}


def add_generation_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions", dependencies=[Depends(require_api_key)])
    async def completions(body: CompletionRequest, raw: Request):
        state.check_model(body.model)
        prompts = [state.tokenize(p) for p in body.prompts()]
        params = body.sampling_params(body.max_tokens, body.logprobs)
        state.check_n(params.n)
        shape = ResponseShape(False, f"cmpl-{secrets.token_hex(12)}", int(time.time()), state.served_model_name,
                              params.logprobs or 0)
        return await generate(state.front, prompts, params, shape, body.stream, body.include_usage, raw)

    @app.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        state.check_model(body.model)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = body.sampling_params(max_tokens, body.num_logprobs())
        state.check_n(params.n)
        prompt = state.chat_prompt(body)
        shape = ResponseShape(True, f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), state.served_model_name,
                              params.logprobs or 0)
        return await generate(state.front, [prompt], params, shape, body.stream, body.include_usage, raw)
