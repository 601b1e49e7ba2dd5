"""The engine client: the HTTP side's one view of the engine, over a transport (in-thread or engine process).

The client owns admission (503 while shutting down, 429 over the waiting limit), the waiting count, and each
request's asyncio side (its event loop, update queue and acceptance future). A transport carries commands to
the engine loop and calls the client's ``ResultSink`` methods with what comes back:

- ``engine_loop.EngineLoop`` is the in-thread transport: the loop thread calls the sink directly;
- ``engine_process.ProcessTransport`` pipes commands to an engine process, and its reader thread calls the sink.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, Protocol

from nanocore.engine.sampling_params import SamplingParams
from nanocore.serve.delivery import RequestStream, call_soon, deliver_by_loop, settle
from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import NewRequest, RequestUpdate


class ResultSink(Protocol):
    """What an engine loop reports (from its own thread). Every added request is reported in ``started`` exactly
    once: when a step admits it, when it is refused, or when it is removed before it ran."""

    def accepted(self, request_id: str, error: BaseException | None) -> None: ...
    def deliver(self, updates: list[tuple[str, RequestUpdate]], started: list[str]) -> None: ...
    def stopped(self, message: str) -> None: ...  # the loop is gone: nothing more will come


class Transport(Protocol):
    info: dict[str, Any]  # engine_info.describe
    tokenizer: Any

    @property
    def is_alive(self) -> bool: ...
    def start(self, sink: ResultSink) -> None: ...
    def add(self, requests: list[NewRequest]) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def abort_all(self, message: str) -> None: ...
    async def render_metrics(self) -> bytes: ...
    def close(self, drain_timeout_s: float) -> None: ...


class _Handle:
    __slots__ = ("loop", "queue", "accepted")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.queue, self.accepted = loop, asyncio.Queue(), loop.create_future()


class EngineClient:
    def __init__(self, transport: Transport, max_waiting_requests: int = 1024):
        if max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {max_waiting_requests}")
        self.transport = transport
        self.info, self.tokenizer = transport.info, transport.tokenizer
        self.max_waiting_requests = max_waiting_requests
        self._requests: dict[str, _Handle] = {}  # until the request's last update (or abort)
        self._lock = threading.Lock()  # the request table, the waiting count and closing
        self._num_waiting = 0  # submitted, not yet admitted to a step (the 429 limit counts these)
        self._accepting = True
        self._closed = False  # the engine loop is gone: nothing will answer again
        transport.start(self)

    @property
    def is_alive(self) -> bool:
        return self.transport.is_alive and not self._closed

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    # ---- the asyncio side ------------------------------------------------------------------
    async def submit(self, prompts: list[list[int]], params: SamplingParams,
                     streaming: bool = False) -> list[RequestStream]:
        """Queue the prompts as one batch (the engine adds them before one step); all are accepted or none is.
        Raises APIError 429 / 503 when refused, ValueError when the engine rejects a prompt."""
        loop, now = asyncio.get_running_loop(), time.perf_counter()
        handles = {f"req-{uuid.uuid4().hex}": _Handle(loop) for _ in prompts}
        batch = [NewRequest(request_id, ids, params, streaming, now) for request_id, ids in zip(handles, prompts)]
        with self._lock:
            self._check_admission()
            self._num_waiting += len(batch)
            self._requests.update(handles)  # from here a stopped engine fails them: the add may go nowhere
        self.transport.add(batch)  # not under the lock: a full pipe must not hold up the reader's deliveries
        futures = [handle.accepted for handle in handles.values()]
        try:
            await asyncio.wait(futures)
        except asyncio.CancelledError:
            for request_id in handles:
                self.abort(request_id)
            for future in futures:  # a refusal that came first is retrieved (never logged as unretrieved)
                if future.done() and not future.cancelled():
                    future.exception()
            raise
        errors = [f.exception() for f in futures]  # retrieves every one (none is logged as never retrieved)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            for request_id in handles:
                self.abort(request_id)
            raise error
        return [RequestStream(self, request_id, handle.queue) for request_id, handle in handles.items()]

    def _check_admission(self) -> None:
        if not self._accepting or self._closed:
            raise APIError(503, "the server is shutting down", type="server_error", code="service_unavailable")
        if self._num_waiting >= self.max_waiting_requests:
            raise APIError(429, f"too many waiting requests ({self._num_waiting}, limit "
                                f"{self.max_waiting_requests}); retry later",
                           type="rate_limit_error", code="rate_limit_exceeded")

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (thread-safe; a finished or unknown id is ignored)."""
        with self._lock:
            known = self._requests.pop(request_id, None) is not None and not self._closed
        if known:
            self.transport.abort(request_id)

    def stop_accepting(self) -> None:
        """New requests get 503 from now on (shutdown started); running ones go on."""
        self._accepting = False

    def abort_all(self, message: str = "the server is shutting down") -> None:
        """End every request in flight with a 503 error (their streams close cleanly); thread-safe."""
        if not self._closed:
            self.transport.abort_all(message)

    async def render_metrics(self) -> bytes:
        return await self.transport.render_metrics()

    def close(self, drain_timeout_s: float = 0.0) -> None:
        """Refuse new requests, let running ones finish for up to ``drain_timeout_s``, abort the rest, stop."""
        self._accepting = False
        self.transport.close(drain_timeout_s)

    # ---- the ResultSink (the transport's thread) -----------------------------------------------
    def accepted(self, request_id: str, error: BaseException | None) -> None:
        with self._lock:
            handle = self._requests.pop(request_id, None) if error is not None else self._requests.get(request_id)
        if handle is not None:
            call_soon(handle.loop, settle, handle.accepted, error)

    def deliver(self, updates: list[tuple[str, RequestUpdate]], started: list[str]) -> None:
        ready = []
        with self._lock:
            self._num_waiting -= len(started)
            for request_id, update in updates:
                handle = self._requests.pop(request_id, None) if update.finished else self._requests.get(request_id)
                if handle is not None:  # else aborted here while the step ran
                    ready.append((handle.loop, handle.queue, update))
        deliver_by_loop(ready)

    def stopped(self, message: str) -> None:
        """The engine loop is gone: every request still here ends with a 503 (or is refused if not accepted)."""
        with self._lock:
            self._closed = True
            handles, self._requests = list(self._requests.values()), {}
        for handle in handles:
            call_soon(handle.loop, _fail_handle, handle, message)


def _fail_handle(handle: _Handle, message: str) -> None:
    """On the request's event loop, after what was scheduled before it (an acceptance may be on its way)."""
    if not handle.accepted.done():
        handle.accepted.set_exception(APIError(503, message, type="server_error", code="service_unavailable"))
    else:
        handle.queue.put_nowait(RequestUpdate(finished=True, error=message, status=503))
