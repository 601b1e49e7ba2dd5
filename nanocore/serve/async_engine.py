"""AsyncEngine: one thread steps ``LLMEngine`` while HTTP requests come and go (continuous batching).

The asyncio side only enqueues commands (add, abort) and reads per-request queues; the loop thread owns the
engine, so no engine state is touched from two threads. Results leave the loop thread through a sink: in this
process (``LoopSink``) one step's updates reach each event loop in one ``call_soon_threadsafe`` call; in an
engine process (``engine_process.py``) they go down a pipe to the HTTP process.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque

import torch

from nanocore.runner.heap import frozen_heap
from nanocore.engine.llm import LLM
from nanocore.engine.sampling_params import SamplingParams
from nanocore.serve.delivery import LoopSink, RequestStream, check_admission
from nanocore.serve.engine_info import describe
from nanocore.serve.metrics import ServerMetrics
from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import RequestUpdate, TrackedRequest

logger = logging.getLogger("nanocore.serve")

IDLE_WAIT_S = 0.5  # an idle loop re-checks its stop flag this often


class AsyncEngine:
    def __init__(self, llm: LLM, max_waiting_requests: int = 1024, metrics: ServerMetrics | None = None,
                 stream_interval: int = 1, sink=None):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (tokens per streamed chunk), got {stream_interval}")
        self.llm = llm
        self.engine = llm.engine
        self.max_waiting_requests = max_waiting_requests
        self.stream_interval = stream_interval
        self.metrics = metrics or ServerMetrics()
        self.info = describe(llm)  # what the routes report (/version, /v1/models) and check (max_num_seqs)
        self.tokenizer = self.engine.tokenizer
        self._sink = sink or LoopSink()
        self._commands: deque = deque()  # ("add", TrackedRequest) / ("abort", request_id), from any thread
        self._wake = threading.Event()
        self._tracked: dict[str, TrackedRequest] = {}  # loop thread only
        self._lock = threading.Lock()  # guards the waiting count and closing against a racing submit
        self._num_waiting = 0  # accepted, not yet admitted to a step (the 429 limit counts these)
        self._accepting = True
        self._closed = False  # the loop has exited: nothing will read the command queue again
        self._stop = False
        self._cuda_index = None  # the loop thread uses the device the engine was built on (it is per thread)
        if self.engine.device.type == "cuda":
            self._cuda_index = self.engine.device.index
            self._cuda_index = torch.cuda.current_device() if self._cuda_index is None else self._cuda_index
        self._thread = threading.Thread(target=self._run, name="nanocore-engine-loop", daemon=True)
        self._thread.start()

    # ---- the asyncio side ----------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    async def submit(self, prompt_token_ids: list[int], params: SamplingParams,
                     streaming: bool = False) -> RequestStream:
        """Queue a request; raises APIError 429 / 503 when refused, ValueError when the engine rejects it."""
        tracked = TrackedRequest(f"req-{uuid.uuid4().hex}", prompt_token_ids, params, asyncio.get_running_loop(),
                                 streaming, self.stream_interval)
        with self._lock:
            check_admission(self._accepting, self._closed, self._num_waiting, self.max_waiting_requests)
            self._num_waiting += 1
            self._send_command(("add", tracked))
        try:
            await tracked.accepted
        except asyncio.CancelledError:
            self.abort(tracked.request_id)
            raise
        return RequestStream(self, tracked.request_id, tracked.queue)

    def add_tracked(self, tracked: TrackedRequest) -> None:
        """Queue a request built elsewhere (an engine process: the HTTP process checked the limits)."""
        with self._lock:
            self._num_waiting += 1
            self._send_command(("add", tracked))

    async def render_metrics(self) -> bytes:
        return self.metrics.render()

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (thread-safe; a finished or unknown id is ignored)."""
        self._send_command(("abort", request_id))

    def stop_accepting(self) -> None:
        """New requests get 503 from now on (shutdown started); running ones go on."""
        self._accepting = False

    def abort_all(self, message: str = "the server is shutting down") -> None:
        """End every request in flight with a 503 error (their streams close cleanly); thread-safe."""
        self._send_command(("abort_all", message))

    def close(self, drain_timeout_s: float = 0.0) -> None:
        """Refuse new requests, let running ones finish for up to ``drain_timeout_s``, abort the rest, stop."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout_s
        while (self._tracked or self._commands) and time.monotonic() < deadline and self.is_alive:
            time.sleep(0.05)
        self._stop = True
        self._wake.set()
        self._thread.join()
        self.engine.close()

    def _send_command(self, command) -> None:
        self._commands.append(command)
        self._wake.set()

    # ---- the loop thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._cuda_index is not None:
                torch.cuda.set_device(self._cuda_index)
            with frozen_heap(collect_first=True):  # the server's lifetime: no full GC scan of the model's heap
                while not self._stop:
                    applied = self._apply_commands()
                    if not self.engine.has_unfinished_requests():
                        if applied:  # an abort on an idle engine frees blocks: /metrics sees it (a step records it)
                            self.metrics.record_step(self.engine, self._num_waiting)
                        self._wake.wait(IDLE_WAIT_S)
                        self._wake.clear()
                        continue
                    self._step()
        except Exception:  # a bug in the loop itself: say so, and answer every request instead of hanging
            logger.exception("the engine loop stopped")
        finally:
            self._refuse_the_rest("the server shut down before this request finished")

    def _refuse_the_rest(self, message: str) -> None:
        """On exit: requests in flight and adds still queued get a 503; later submits are refused."""
        with self._lock:
            self._closed = True
            commands, self._commands = list(self._commands), deque()
        for kind, payload in commands:
            if kind == "add":
                self._count_started(payload)
                self._sink.accepted(payload, APIError(503, message, type="server_error", code="service_unavailable"))
        for request_id in list(self._tracked):
            self._fail(request_id, message, status=503)

    def _apply_commands(self) -> bool:
        """Adds and aborts queued by the HTTP side; whether there were any."""
        if not self._commands:
            return False
        while self._commands:
            kind, payload = self._commands.popleft()
            if kind == "add":
                self._add(payload)
            elif kind == "abort_all":
                for request_id in list(self._tracked):
                    self._fail(request_id, payload, status=503)
            elif payload in self._tracked:
                self._remove(payload, abort=True)
        return True

    def _add(self, tracked: TrackedRequest) -> None:
        try:
            # a whole-body request is detokenized once at the end (no per-step host work: async scheduling stays on)
            tracked.engine_request = self.engine.add_request(tracked.prompt_token_ids, tracked.params,
                                                             request_id=tracked.request_id, stream=tracked.streaming)
        except Exception as exc:  # a rejected prompt must not stop the loop
            self._count_started(tracked)
            self._sink.accepted(tracked, exc)
            return
        self._tracked[tracked.request_id] = tracked
        self._sink.accepted(tracked, None)

    def _step(self) -> None:
        try:
            finished = self.engine.step()
        except Exception as exc:  # fail the requests that were admitted (the step's batch), keep serving
            logger.exception("engine step failed; failing the admitted requests")
            for request_id, tracked in list(self._tracked.items()):
                if tracked.admitted_now():
                    self._fail(request_id, f"engine step failed: {exc}")
            return
        now = time.perf_counter()
        outputs = {o.request_id: o for o in finished}
        ready = []
        for request_id, tracked in list(self._tracked.items()):
            try:
                update = self._collect(tracked, outputs.get(request_id), now)
            except Exception as exc:  # this request's output code failed: fail it alone
                logger.exception("request %s failed while building its output", request_id)
                self._fail(request_id, f"building the output failed: {exc}")
                continue
            if update is not None and update.worth_sending:
                ready.append((tracked, update))
                if update.finished:
                    self._remove(request_id, abort=update.error is not None)
        if ready:
            self._sink.deliver(ready)
        self.metrics.record_step(self.engine, self._num_waiting)

    def _collect(self, tracked: TrackedRequest, output, now: float) -> RequestUpdate | None:
        if not tracked.started and tracked.has_started():
            self._count_started(tracked)
        update = tracked.collect(self.engine, output)
        if update is not None and update.new_tokens:
            ttft, gap = tracked.mark_tokens(now)
            self.metrics.observe_token_times(ttft, gap)
        if update is not None and update.finished and update.error is None:
            reasons = [o.finish_reason for o in update.output.outputs] if update.output else []
            self.metrics.record_finished(reasons, now - tracked.arrival_time)
        return update

    def _count_started(self, tracked: TrackedRequest) -> None:
        """``tracked`` no longer waits: admitted to a step, refused, or removed before it ran."""
        with self._lock:
            self._num_waiting -= 1
        self._sink.started(tracked)

    def _remove(self, request_id: str, abort: bool) -> None:
        tracked = self._tracked.pop(request_id)
        if not tracked.started:
            self._count_started(tracked)
        if abort:
            try:
                self.engine.abort_request(request_id)
            except Exception:  # the request still gets its answer; its blocks are the engine's problem now
                logger.exception("aborting request %s failed", request_id)

    def _fail(self, request_id: str, message: str, status: int = 500) -> None:
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return
        self._remove(request_id, abort=True)
        self._sink.deliver([(tracked, RequestUpdate(finished=True, error=message, status=status))])
