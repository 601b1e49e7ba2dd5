"""The engine in its own process: the HTTP process and the engine loop stop competing for one GIL.

In one process the event loop's per-chunk work (SSE text, uvicorn writes: tens of microseconds per streamed
token) and the engine thread's per-step host work share the GIL; at a few hundred concurrent streams that, not
the GPU, sets the served throughput. Here the child process runs ``AsyncEngine``'s loop thread with a
``PipeSink``; the HTTP process (``EngineProcessFront``) sends commands down one pipe and a reader thread turns the
child's messages (one per step: every request's update) into the per-request asyncio queues.

Messages child -> HTTP: ``(kind, payload, started_ids)``; ``started_ids`` are requests that stopped waiting
(the 429 limit counts waiting requests on the HTTP side). Kinds: ready, failed, accepted, updates, metrics, closed.
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import multiprocessing
import signal
import threading
import uuid

from nanocore.engine.sampling_params import SamplingParams
from nanocore.serve.delivery import (
    RequestStream,
    call_soon,
    check_admission,
    deliver,
    deliver_by_loop,
    settle,
)
from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import RequestUpdate

logger = logging.getLogger("nanocore.serve")

CLOSE_BACKSTOP_S = 60.0  # after the drain timeout, the child gets this long to stop before it is killed
METRICS_TIMEOUT_S = 10.0


def encode_error(exc: BaseException | None):
    """An exception as plain data (APIError's keyword arguments do not survive pickling)."""
    if exc is None:
        return None
    if isinstance(exc, APIError):
        return ("api", exc.status, exc.message, exc.type, exc.param, exc.code)
    return ("value" if isinstance(exc, ValueError) else "other", f"{exc}" if isinstance(exc, ValueError)
            else f"{type(exc).__name__}: {exc}")


def decode_error(data) -> BaseException | None:
    if data is None:
        return None
    if data[0] == "api":
        return APIError(*data[1:3], type=data[3], param=data[4], code=data[5])
    return ValueError(data[1]) if data[0] == "value" else RuntimeError(data[1])


class PipeSink:
    """``AsyncEngine`` results down a pipe (one message per step); sends are serialised by a lock because the
    command thread answers metrics requests on the same pipe."""

    def __init__(self, conn):
        self.conn, self.lock, self.started_ids = conn, threading.Lock(), []

    def send(self, kind: str, payload) -> None:
        with self.lock:
            started, self.started_ids = self.started_ids, []
            self.conn.send((kind, payload, started))

    def accepted(self, tracked, exc: BaseException | None) -> None:
        self.send("accepted", (tracked.request_id, encode_error(exc)))

    def deliver(self, ready) -> None:
        self.send("updates", [(tracked.request_id, update) for tracked, update in ready])

    def started(self, tracked) -> None:
        with self.lock:
            self.started_ids.append(tracked.request_id)


def child_main(config, commands, out, stream_interval: int, log_level: str) -> None:
    """The engine process: build the LLM, report ready (with the tokenizer), then obey commands until close."""
    from nanocore.engine.llm import LLM
    from nanocore.serve.async_engine import AsyncEngine
    from nanocore.serve.request_state import TrackedRequest

    # Ctrl-C / a service manager's SIGTERM reach the whole process group: the HTTP process drains, then closes us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("nanocore").setLevel(log_level.upper())
    sink = PipeSink(out)
    try:
        front = AsyncEngine(LLM(config=config), max_waiting_requests=1 << 62, stream_interval=stream_interval,
                            sink=sink)
        sink.send("ready", (front.info, front.tokenizer))
    except BaseException as exc:  # the HTTP process reports it; nothing to serve
        sink.send("failed", f"{type(exc).__name__}: {exc}")
        return
    while True:
        try:
            command = commands.recv()
        except (EOFError, OSError):  # the HTTP process is gone: stop, abort what runs
            command = ("close", 0.0)
        kind = command[0]
        if kind == "add":
            _, request_id, prompt_token_ids, params, streaming = command
            front.add_tracked(TrackedRequest(request_id, prompt_token_ids, params, None, streaming, stream_interval))
        elif kind == "abort":
            front.abort(command[1])
        elif kind == "abort_all":
            front.abort_all(command[1])
        elif kind == "metrics":
            sink.send("metrics", (command[1], front.metrics.render()))
        elif kind == "close":
            front.close(command[1])
            sink.send("closed", None)
            return


class _Handle:
    __slots__ = ("loop", "queue", "accepted")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.queue, self.accepted = loop, asyncio.Queue(), loop.create_future()


class EngineProcessFront:
    """``AsyncEngine``'s interface over an engine in a child process (spawned: CUDA is never forked)."""

    def __init__(self, config, max_waiting_requests: int = 1024, stream_interval: int = 1, log_level: str = "info"):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (tokens per streamed chunk), got {stream_interval}")
        context = multiprocessing.get_context("spawn")
        child_commands, self._commands = context.Pipe(duplex=False)
        self._out, child_out = context.Pipe(duplex=False)
        # not a daemon: a daemonic process may not start the tensor-parallel workers; it stops when its command
        # pipe closes instead (close(), or this process exiting: the atexit hook, or being killed)
        self._process = context.Process(target=child_main, name="nanocore-engine", daemon=False,
                                        args=(config, child_commands, child_out, stream_interval, log_level))
        self._process.start()
        child_commands.close()
        child_out.close()
        atexit.register(self._commands.close)  # runs before multiprocessing joins its children at exit
        self.max_waiting_requests = max_waiting_requests
        self.info, self.tokenizer = self._wait_ready()
        self._requests: dict[str, _Handle] = {}
        self._lock = threading.Lock()  # waiting count, the request table, command sends
        self._num_waiting = 0
        self._accepting, self._closed = True, False
        self._metrics_waiters: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._metrics_ids = itertools.count()
        self._reader = threading.Thread(target=self._read, name="nanocore-engine-reader", daemon=True)
        self._reader.start()

    def _wait_ready(self):
        try:
            kind, payload, _ = self._out.recv()
        except (EOFError, OSError):
            self._process.join(timeout=30)
            raise RuntimeError(f"the engine process exited with code {self._process.exitcode} before it was "
                               f"ready; its log above says why") from None
        if kind != "ready":
            self._process.join(timeout=30)
            raise RuntimeError(f"the engine process failed to start: {payload}")
        return payload

    # ---- the asyncio side ----------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        return self._process.is_alive() and not self._closed

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    async def submit(self, prompt_token_ids: list[int], params: SamplingParams,
                     streaming: bool = False) -> RequestStream:
        request_id, handle = f"req-{uuid.uuid4().hex}", _Handle(asyncio.get_running_loop())
        with self._lock:
            check_admission(self._accepting, self._closed, self._num_waiting, self.max_waiting_requests)
            self._num_waiting += 1
            self._requests[request_id] = handle
            self._commands.send(("add", request_id, prompt_token_ids, params, streaming))
        try:
            await handle.accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return RequestStream(self, request_id, handle.queue)

    def abort(self, request_id: str) -> None:
        with self._lock:
            if self._requests.pop(request_id, None) is not None and not self._closed:
                self._send(("abort", request_id))

    def stop_accepting(self) -> None:
        self._accepting = False

    def abort_all(self, message: str = "the server is shutting down") -> None:
        with self._lock:
            self._send(("abort_all", message))

    async def render_metrics(self) -> bytes:
        loop = asyncio.get_running_loop()
        token, future = next(self._metrics_ids), loop.create_future()
        with self._lock:
            self._metrics_waiters[token] = (loop, future)
            self._send(("metrics", token))
        try:
            return await asyncio.wait_for(future, METRICS_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise APIError(503, "the engine process did not answer for metrics", type="server_error") from None
        finally:
            self._metrics_waiters.pop(token, None)

    def close(self, drain_timeout_s: float = 0.0) -> None:
        """Refuse new requests, let the child drain for up to ``drain_timeout_s`` and stop; kill it if it hangs."""
        self._accepting = False
        with self._lock:
            self._send(("close", drain_timeout_s))
        self._process.join(timeout=drain_timeout_s + CLOSE_BACKSTOP_S)
        if self._process.is_alive():
            logger.error("the engine process did not stop; killing it")
            self._process.kill()
            self._process.join()
        self._reader.join(timeout=10)
        atexit.unregister(self._commands.close)
        self._commands.close()

    def _send(self, command) -> None:
        """Caller holds ``_lock``; a dead child is ignored here (the reader fails what was in flight)."""
        try:
            self._commands.send(command)
        except (OSError, ValueError):
            pass

    # ---- the reader thread ---------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                kind, payload, started = self._out.recv()
                if started:
                    with self._lock:
                        self._num_waiting -= len(started)
                if kind == "updates":
                    self._dispatch(payload)
                elif kind == "accepted":
                    self._settle_accepted(*payload)
                elif kind == "metrics":
                    loop, future = self._metrics_waiters.get(payload[0], (None, None))
                    if future is not None:
                        call_soon(loop, _set_result, future, payload[1])
                elif kind == "closed":
                    break
        except (EOFError, OSError):
            logger.error("the engine process exited (code %s)", self._process.exitcode)
        finally:
            self._fail_the_rest()

    def _dispatch(self, updates: list[tuple[str, RequestUpdate]]) -> None:
        ready = []
        with self._lock:
            for request_id, update in updates:
                handle = self._requests.pop(request_id) if update.finished else self._requests.get(request_id)
                if handle is not None:  # else aborted here while the step ran
                    ready.append((handle.loop, handle.queue, update))
        deliver_by_loop(ready)

    def _settle_accepted(self, request_id: str, error) -> None:
        with self._lock:
            handle = self._requests.pop(request_id, None) if error is not None else self._requests.get(request_id)
        if handle is not None:
            call_soon(handle.loop, settle, handle.accepted, decode_error(error))

    def _fail_the_rest(self) -> None:
        """The child is gone: every request still here ends with a 503 (or is refused, if not yet accepted)."""
        with self._lock:
            self._closed = True
            handles, self._requests = list(self._requests.values()), {}
        message = "the engine stopped before this request finished"
        for handle in handles:
            if not handle.accepted.done():
                call_soon(handle.loop, settle, handle.accepted,
                           APIError(503, message, type="server_error", code="service_unavailable"))
            else:
                call_soon(handle.loop, deliver, [(handle.queue, RequestUpdate(finished=True, error=message,
                                                                                 status=503))])


def _set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)
