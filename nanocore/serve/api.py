"""The FastAPI app: health, version, metrics and model routes, errors in OpenAI's shape, the body limit."""
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
from nanocore.serve.body_limit import BodyLimit
from nanocore.serve.engine_client import EngineClient
from nanocore.serve.metrics import CONTENT_TYPE
from nanocore.serve.openapi import errors, install_schema
from nanocore.serve.prompts import PromptPreparer
from nanocore.serve.protocol import APIError, bad_request, validation_message
from nanocore.serve.request_fields import FieldCheck
from nanocore.serve.tool_parsers import choose_parser
from nanocore.serve.routes import add_generation_routes

logger = logging.getLogger("nanocore.serve")


class ServerState:
    """What the routes need: the engine client, prompt preparation, the served name, the API key, the tool call
    parser. ``chat_template``: template text that replaces the tokenizer's; ``tool_call_parser``: a name of
    ``tool_parsers.PARSERS`` or "auto"."""

    def __init__(self, client: EngineClient, served_model_name: str | None, api_key: str | None,
                 drain_timeout_s: float = 30.0, chat_template: str | None = None, tool_call_parser: str = "auto"):
        self.client, self.served_model_name = client, served_model_name or client.info["model"]
        self.api_key, self.drain_timeout_s = api_key, drain_timeout_s
        self.backends = client.info["backends"]
        self.max_model_len, self.vocab_size = client.info["max_model_len"], client.info["vocab_size"]
        self.prompts = PromptPreparer(client.tokenizer, self.max_model_len, self.vocab_size, chat_template)
        self.tool_parser = choose_parser(tool_call_parser, self.prompts.template_text,
                                         client.info.get("architectures", []))
        self.check_fields = FieldCheck()
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.served_model_name}` (see GET /v1/models)", param="model",
                           code="model_not_found")

    def check_n(self, n: int) -> None:
        limit = self.client.info["max_num_seqs"]
        if n > limit:
            raise bad_request(f"n = {n} is more samples than the server runs at once (max_num_seqs = {limit})", "n")

    def model_card(self) -> dict:
        return {"id": self.served_model_name, "object": "model", "created": self.created, "owned_by": "nanocore",
                "root": self.client.info["model"], "max_model_len": self.max_model_len}

    def close(self) -> None:
        self.client.close(self.drain_timeout_s)
        self.prompts.close()


def require_api_key(request: Request) -> None:
    key = request.app.state.serve.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key")


def build_app(state: ServerState, max_body_bytes: int) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(state.close)

    app = FastAPI(title="nanocore", version=nanocore.__version__, lifespan=lifespan)
    app.state.serve = state
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    add_error_handlers(app)
    add_info_routes(app, state)
    add_generation_routes(app, state, Depends(require_api_key))
    install_schema(app)
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
        code = "request_too_large" if exc.status_code == 413 else None
        error = APIError(exc.status_code, str(exc.detail), type=kind, code=code)
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception):
        logger.exception("unexpected error while serving a request")
        return JSONResponse(APIError(500, f"internal error: {exc}", type="server_error").body(), status_code=500)


def add_info_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses=errors(503))
    async def health():
        if not state.client.is_alive:
            raise APIError(503, "the engine loop has stopped", type="server_error")
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        info = state.client.info
        return {"version": nanocore.__version__, "model": info["model"], "device": info["device"],
                "served_model_name": state.served_model_name, "backends": state.backends,
                "vocab_size": info["vocab_size"], "max_model_len": info["max_model_len"]}

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics():
        return Response(await state.client.render_metrics(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=[Depends(require_api_key)], responses=errors(401))
    async def models():
        return {"object": "list", "data": [state.model_card()]}

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(require_api_key)], responses=errors(401, 404))
    async def model(model_id: str):
        state.check_model(model_id)
        return state.model_card()
