"""Build the server from an LLM and run it: under uvicorn in the foreground (``nanocore serve``), or in a
background thread on a free port (tests, ``nanocore bench serve``)."""
from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI

from nanocore.engine.llm import LLM
from nanocore.serve.api import ServerState, build_app
from nanocore.serve.body_limit import DEFAULT_MAX_BODY_MIB
from nanocore.serve.engine_client import EngineClient
from nanocore.serve.engine_loop import EngineLoop
from nanocore.serve.prompts import load_chat_template
from nanocore.serve.tool_parsers import TOOL_CALL_PARSER_CHOICES

#: The engine thread waits for the GPU with the GIL released; when the wait ends it must get the GIL back from
#: the HTTP thread within about this long (Python's default, 5 ms, can idle the GPU for a whole decode step).
GIL_SWITCH_INTERVAL_S = 0.0005
SHUTDOWN_BACKSTOP_S = 10.0  # uvicorn cancels what is left this long after the drain timeout


def create_app(llm: LLM, served_model_name: str | None = None, api_key: str | None = None,
               max_waiting_requests: int = 1024, drain_timeout_s: float = 30.0, stream_interval: int = 1,
               max_body_mib: float = DEFAULT_MAX_BODY_MIB, chat_template: str | None = None,
               tool_call_parser: str = "auto") -> FastAPI:
    """The app with its engine loop already running in a thread (it stops at the app's shutdown).
    ``chat_template``: a template file or text (``--chat-template``); ``tool_call_parser``: ``--tool-call-parser``."""
    template, limit = chat_options(chat_template, tool_call_parser), body_limit_bytes(max_body_mib)
    client = EngineClient(EngineLoop(llm, stream_interval=stream_interval), max_waiting_requests)
    return build_app(ServerState(client, served_model_name, api_key, drain_timeout_s, template, tool_call_parser),
                     limit)


def create_process_app(config, served_model_name: str | None = None, api_key: str | None = None,
                       max_waiting_requests: int = 1024, drain_timeout_s: float = 30.0, stream_interval: int = 1,
                       log_level: str = "info", max_body_mib: float = DEFAULT_MAX_BODY_MIB,
                       chat_template: str | None = None, tool_call_parser: str = "auto") -> FastAPI:
    """The app over an engine in its own process (``engine_process.py``): HTTP and engine do not share a GIL."""
    from nanocore.serve.engine_process import ProcessTransport

    template, limit = chat_options(chat_template, tool_call_parser), body_limit_bytes(max_body_mib)
    client = EngineClient(ProcessTransport(config, stream_interval=stream_interval, log_level=log_level),
                          max_waiting_requests)
    return build_app(ServerState(client, served_model_name, api_key, drain_timeout_s, template, tool_call_parser),
                     limit)


def chat_options(chat_template: str | None, tool_call_parser: str) -> str | None:
    """The chat template's text; both options checked before an engine starts."""
    if tool_call_parser not in TOOL_CALL_PARSER_CHOICES:
        raise ValueError(f"unknown tool call parser {tool_call_parser!r}; choose one of "
                         f"{list(TOOL_CALL_PARSER_CHOICES)}")
    return load_chat_template(chat_template)


def body_limit_bytes(mib: float) -> int:
    if not mib > 0:
        raise ValueError(f"the request body limit must be > 0 MiB, got {mib}")
    return int(mib * (1 << 20))


def serve(app: FastAPI, host: str, port: int, drain_timeout_s: float = 30.0, log_level: str = "info") -> None:
    """Run until SIGINT / SIGTERM: new connections are refused, in-flight requests get ``drain_timeout_s`` to
    finish, then the rest end with a 503 error and the engine loop stops."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_keep_alive=30,
                            timeout_graceful_shutdown=drain_timeout_s + SHUTDOWN_BACKSTOP_S)
    DrainingServer(config, app.state.serve.client, drain_timeout_s).run()


class DrainingServer(uvicorn.Server):
    """uvicorn's graceful shutdown, plus: after ``drain_timeout_s`` the requests still running are ended by the
    engine client (a clean 503 / stream error event) instead of uvicorn cancelling their tasks."""

    def __init__(self, config: uvicorn.Config, client: EngineClient, drain_timeout_s: float):
        super().__init__(config)
        self.client, self.drain_timeout_s = client, drain_timeout_s

    async def shutdown(self, sockets=None) -> None:
        self.client.stop_accepting()
        timer = asyncio.get_running_loop().call_later(self.drain_timeout_s, self.client.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """``with ServerThread(app) as url:`` serves ``app`` on a free local port from a background thread."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int | None = None, startup_timeout_s: float = 60):
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="nanocore-uvicorn", daemon=True)
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
