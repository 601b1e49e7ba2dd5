"""The engine in its own process: the HTTP process and the engine loop stop competing for one GIL.

In one process the event loop's per-chunk work (SSE text, uvicorn writes: tens of microseconds per streamed
token) and the engine thread's per-step host work share the GIL; at a few hundred concurrent streams that, not
the GPU, sets the served throughput. Here a child process runs ``EngineLoop`` with a ``PipeSink``; in the HTTP
process ``ProcessTransport`` sends the engine client's commands down one pipe, and its reader thread hands the
child's messages (one per step: every request's update) to the client.

Messages child -> HTTP are ``(kind, payload)``; kinds: ready, failed, accepted, updates, metrics, stopped, closed.
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import multiprocessing
import signal
import threading

from nanocore.serve.delivery import call_soon
from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import CommandSender

logger = logging.getLogger("nanocore.serve")

CLOSE_BACKSTOP_S = 60.0  # after the drain timeout, the child gets this long to stop before it is killed
METRICS_TIMEOUT_S = 10.0
GONE = "the engine stopped before this request finished"


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
    """The engine loop's results down a pipe; sends are serialised by a lock because the command thread answers
    metrics requests on the same pipe."""

    def __init__(self, conn):
        self.conn, self.lock = conn, threading.Lock()

    def send(self, kind: str, payload) -> None:
        with self.lock:
            self.conn.send((kind, payload))

    def accepted(self, request_id: str, error: BaseException | None) -> None:
        self.send("accepted", (request_id, encode_error(error)))

    def deliver(self, updates, started: list[str]) -> None:
        self.send("updates", (updates, started))

    def stopped(self, message: str) -> None:
        self.send("stopped", message)


def child_main(config, commands, out, stream_interval: int, log_level: str) -> None:
    """The engine process: build the LLM, report ready (with the tokenizer), then obey commands until close."""
    from nanocore.engine.llm import LLM
    from nanocore.serve.engine_loop import EngineLoop

    # Ctrl-C / a service manager's SIGTERM reach the whole process group: the HTTP process drains, then closes us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("nanocore").setLevel(log_level.upper())
    sink = PipeSink(out)
    try:
        loop = EngineLoop(LLM(config=config), stream_interval=stream_interval)
        loop.start(sink)
        sink.send("ready", (loop.info, loop.tokenizer))
    except BaseException as exc:  # the HTTP process reports it; nothing to serve
        sink.send("failed", f"{type(exc).__name__}: {exc}")
        return
    while True:
        try:
            kind, payload = commands.recv()
        except (EOFError, OSError):  # the HTTP process is gone: stop, abort what runs
            kind, payload = "close", 0.0
        if kind == "add":
            loop.add(payload)
        elif kind == "abort":
            loop.abort(payload)
        elif kind == "abort_all":
            loop.abort_all(payload)
        elif kind == "metrics":
            sink.send("metrics", (payload, loop.metrics.render()))
        elif kind == "close":
            loop.close(payload)
            sink.send("closed", None)
            return


class ProcessTransport(CommandSender):
    """The engine client's transport to an engine in a child process (spawned: CUDA is never forked)."""

    def __init__(self, config, stream_interval: int = 1, log_level: str = "info"):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (tokens per streamed chunk), got {stream_interval}")
        context = multiprocessing.get_context("spawn")
        child_commands, self._commands = context.Pipe(duplex=False)
        self._out, child_out = context.Pipe(duplex=False)
        # not a daemon: a daemonic process may not start the tensor-parallel workers; it stops when its command
        # pipe closes instead (close(), or this process exiting: the atexit hook, or being killed)
        self.process = context.Process(target=child_main, name="nanocore-engine", daemon=False,
                                       args=(config, child_commands, child_out, stream_interval, log_level))
        self.process.start()
        child_commands.close()
        child_out.close()
        atexit.register(self._commands.close)  # runs before multiprocessing joins its children at exit
        self.info, self.tokenizer = self._wait_ready()
        self._sink = None
        self._send_lock = threading.Lock()
        self._metrics_waiters: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._metrics_ids = itertools.count()
        self._reader = threading.Thread(target=self._read, name="nanocore-engine-reader", daemon=True)

    def _wait_ready(self):
        try:
            kind, payload = self._out.recv()
        except (EOFError, OSError):
            self.process.join(timeout=30)
            raise RuntimeError(f"the engine process exited with code {self.process.exitcode} before it was "
                               f"ready; its log above says why") from None
        if kind != "ready":
            self.process.join(timeout=30)
            raise RuntimeError(f"the engine process failed to start: {payload}")
        return payload

    # ---- the transport interface ---------------------------------------------------------------
    def start(self, sink) -> None:
        self._sink = sink
        self._reader.start()

    @property
    def is_alive(self) -> bool:
        return self.process.is_alive() and self._reader.is_alive()

    async def render_metrics(self) -> bytes:
        loop = asyncio.get_running_loop()
        token, future = next(self._metrics_ids), loop.create_future()
        self._metrics_waiters[token] = (loop, future)
        self._send(("metrics", token))
        try:
            return await asyncio.wait_for(future, METRICS_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise APIError(503, "the engine process did not answer for metrics", type="server_error") from None
        finally:
            self._metrics_waiters.pop(token, None)

    def close(self, drain_timeout_s: float = 0.0) -> None:
        """Let the child drain for up to ``drain_timeout_s`` and stop; kill it if it hangs."""
        self._send(("close", drain_timeout_s))
        self.process.join(timeout=drain_timeout_s + CLOSE_BACKSTOP_S)
        if self.process.is_alive():
            logger.error("the engine process did not stop; killing it")
            self.process.kill()
            self.process.join()
        if self._reader.is_alive():
            self._reader.join(timeout=10)
        atexit.unregister(self._commands.close)
        self._commands.close()

    def _send(self, command) -> None:
        """A dead child is ignored here (the reader tells the client, which fails what was in flight)."""
        with self._send_lock:
            try:
                self._commands.send(command)
            except (OSError, ValueError):
                pass

    # ---- the reader thread -------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                kind, payload = self._out.recv()
                if kind == "updates":
                    self._sink.deliver(*payload)
                elif kind == "accepted":
                    self._sink.accepted(payload[0], decode_error(payload[1]))
                elif kind == "metrics":
                    loop, future = self._metrics_waiters.get(payload[0], (None, None))
                    if future is not None:
                        call_soon(loop, _set_result, future, payload[1])
                elif kind == "stopped":
                    self._sink.stopped(payload)
                elif kind == "closed":
                    break
        except (EOFError, OSError):
            logger.error("the engine process exited (code %s)", self.process.exitcode)
        finally:
            self._sink.stopped(GONE)


def _set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)
