"""The engine loop: one thread steps ``LLMEngine`` while requests come and go (continuous batching).

Commands (add a batch, abort, abort all) arrive from any thread through a queue; the loop thread alone touches the
engine. Results leave through a sink (``engine_client.ResultSink``): the engine client itself when the loop runs
in the HTTP process (this class is then the client's in-thread transport), or a pipe when it runs in an engine
process (``engine_process.py``).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

import torch

from nanocore.runner.heap import frozen_heap
from nanocore.engine.llm import LLM
from nanocore.serve.constraint_compiles import ConstraintCompiles
from nanocore.serve.engine_info import describe
from nanocore.serve.metrics import ServerMetrics
from nanocore.serve.request_state import CommandSender, NewRequest, RequestUpdate, TrackedRequest

logger = logging.getLogger("nanocore.serve")

IDLE_WAIT_S = 0.5  # an idle loop re-checks its stop flag this often
STOPPED = "the server shut down before this request finished"


class EngineLoop(CommandSender):
    """Owns the engine and the engine-side state of each request; ``start(sink)`` runs the loop thread."""

    def __init__(self, llm: LLM, stream_interval: int = 1, metrics: ServerMetrics | None = None):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 (tokens per streamed chunk), got {stream_interval}")
        self.engine = llm.engine
        self.stream_interval = stream_interval
        self.metrics = metrics or ServerMetrics()
        self.info = describe(llm)  # what the routes report (/version, /v1/models) and check (max_model_len)
        self.tokenizer = self.engine.tokenizer
        self._sink = None
        # ("add", [NewRequest]) / ("compiled", [NewRequest]) / ("abort", id) / ("abort_all", message)
        self._commands: deque = deque()
        self._compiles = ConstraintCompiles(self.engine.structured, lambda batch: self._send(("compiled", batch)))
        self._wake = threading.Event()
        self._tracked: dict[str, TrackedRequest] = {}  # loop thread only
        self._started: list[str] = []  # ids that stopped waiting since the last delivery (the client counts them)
        self._stop = False
        self._cuda_index = None  # the loop thread uses the device the engine was built on (it is per thread)
        if self.engine.device.type == "cuda":
            self._cuda_index = self.engine.device.index
            self._cuda_index = torch.cuda.current_device() if self._cuda_index is None else self._cuda_index
        self._thread = threading.Thread(target=self._run, name="nanocore-engine-loop", daemon=True)

    # ---- the transport interface (any thread) ----------------------------------------------
    def start(self, sink) -> None:
        self._sink = sink
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    async def render_metrics(self) -> bytes:
        return self.metrics.render()

    def close(self, drain_timeout_s: float = 0.0) -> None:
        """Let running requests finish for up to ``drain_timeout_s``, then stop (the sink fails the rest)."""
        deadline = time.monotonic() + drain_timeout_s
        while (self._tracked or self._commands) and time.monotonic() < deadline and self.is_alive:
            time.sleep(0.05)
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._compiles.close()
        self.engine.close()

    def _send(self, command) -> None:
        self._commands.append(command)
        self._wake.set()

    # ---- the loop thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._cuda_index is not None:
                torch.cuda.set_device(self._cuda_index)
            with frozen_heap(collect_first=True):  # the server's lifetime: no full GC scan of the model's heap
                while not self._stop:
                    applied = self._apply_commands()
                    if not self.engine.has_unfinished_requests():
                        if applied:  # an abort on an idle engine frees blocks: /metrics sees it (a step records it)
                            self.metrics.record_step(self.engine, self._num_waiting())
                        self._wake.wait(IDLE_WAIT_S)
                        self._wake.clear()
                        continue
                    self._step()
        except Exception:  # a bug in the loop itself: say so, and answer every request instead of hanging
            logger.exception("the engine loop stopped")
        finally:
            self._sink.stopped(STOPPED)

    def _apply_commands(self) -> bool:
        """Adds and aborts queued by the HTTP side; whether there were any."""
        if not self._commands:
            return False
        while self._commands:
            kind, payload = self._commands.popleft()
            if kind == "add":
                if not self._compiles.defer(payload):  # constraints compile off this thread first
                    self._add_batch(payload)
            elif kind == "compiled":
                self._add_batch(payload, self._compiles.returned(payload))
            elif kind == "abort_all":
                self._compiles.abort_all(payload)
                for request_id in list(self._tracked):
                    self._fail(request_id, payload, status=503)
            elif payload in self._tracked:
                self._remove(payload, abort=True)
            else:
                self._compiles.abort(payload)
        self._flush([])
        return True

    def _add_batch(self, batch: list[NewRequest], refused: BaseException | None = None) -> None:
        """Every request of the batch is added, or none is (the first refusal, or ``refused``, answers them all)."""
        if refused is not None:
            for request in batch:
                self._started.append(request.request_id)
                self._sink.accepted(request.request_id, refused)
            return
        added: list[TrackedRequest] = []
        for position, new in enumerate(batch):
            tracked = TrackedRequest(new, self.stream_interval)
            try:
                # a whole-body request is detokenized once at the end (no per-step host work: async scheduling on)
                tracked.engine_request = self.engine.add_request(new.prompt_token_ids, new.params,
                                                                 request_id=new.request_id, stream=new.streaming)
            except Exception as exc:  # a rejected prompt must not stop the loop
                for done in added:
                    self.engine.abort_request(done.request_id)
                error = ValueError(f"prompt {position}: {exc}") if len(batch) > 1 and isinstance(exc, ValueError) \
                    else exc
                for refused in batch:
                    self._started.append(refused.request_id)
                    self._sink.accepted(refused.request_id, error)
                return
            added.append(tracked)
        for tracked in added:
            self._tracked[tracked.request_id] = tracked
            self._sink.accepted(tracked.request_id, None)

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
                ready.append((request_id, update))
                if update.finished:
                    self._remove(request_id, abort=update.error is not None)
        self._flush(ready)
        self.metrics.record_step(self.engine, self._num_waiting())

    def _collect(self, tracked: TrackedRequest, output, now: float) -> RequestUpdate | None:
        if not tracked.started and tracked.has_started():
            self._started.append(tracked.request_id)
        update = tracked.collect(self.engine, output)
        if update is not None and update.new_tokens:
            ttft, gap = tracked.mark_tokens(now)
            self.metrics.observe_token_times(ttft, gap)
        if update is not None and update.finished and update.error is None:
            reasons = [o.finish_reason for o in update.output.outputs] if update.output else []
            self.metrics.record_finished(reasons, now - tracked.arrival_time)
        return update

    def _num_waiting(self) -> int:
        """Requests added but not yet admitted to a step (the metrics gauge)."""
        return sum(not tracked.started for tracked in self._tracked.values())

    def _flush(self, ready: list[tuple[str, RequestUpdate]]) -> None:
        if ready or self._started:
            started, self._started = self._started, []
            self._sink.deliver(ready, started)

    def _remove(self, request_id: str, abort: bool) -> None:
        tracked = self._tracked.pop(request_id)
        if not tracked.started:
            tracked.started = True
            self._started.append(request_id)
        if abort:
            try:
                self.engine.abort_request(request_id)
            except Exception:  # the request still gets its answer; its blocks are the engine's problem now
                logger.exception("aborting request %s failed", request_id)

    def _fail(self, request_id: str, message: str, status: int = 500) -> None:
        if request_id not in self._tracked:
            return
        self._remove(request_id, abort=True)
        self._flush([(request_id, RequestUpdate(finished=True, error=message, status=status))])
