"""The ingress's engine-client transport: each batch goes to an engine replica through a Ray Serve handle.

``EngineClient`` (the server's own) keeps admission, the waiting count and each request's asyncio side; this
transport sends each ``add`` as one streaming call (the router picks the replica) and hands the replica's events to
the client, so the routes, prompts and responses are exactly those of ``nanocore serve``. A replica that dies before
it reported anything for a batch gets the batch resent once (Ray Serve routes it to a live replica); after that a
failure ends the batch's requests with a 503.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import time

from ray.exceptions import RayActorError

from nanocore.serve.delivery import call_soon
from nanocore.serve.engine_process import decode_error
from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import NewRequest, RequestUpdate
from nanocore.ray.metrics import RoutingMetrics
from nanocore.ray.routing import RoutedBatch, affinity_key

logger = logging.getLogger("nanocore.ray")

RESENDS = 1  # a batch no replica has reported on yet is sent again this many times when its replica dies
#: The replica ids that served the current HTTP request (the ingress's middleware sets it; responses carry it).
SERVED_BY: contextvars.ContextVar[list | None] = contextvars.ContextVar("nanocore_served_by", default=None)


class BatchState:
    """What the client has been told about one batch, so that every request is settled exactly once."""

    def __init__(self, requests: list[NewRequest], served_by: list | None):
        self.request_ids = [r.request_id for r in requests]
        self.unaccepted, self.unstarted, self.unfinished = set(self.request_ids), set(self.request_ids), \
            set(self.request_ids)
        self.heard = False  # the replica reported something: resending could run a request twice
        self.served_by = served_by
        self.replica_id: str | None = None

    def apply(self, sink, event: tuple) -> bool:
        """Hand one replica event to the client; False when the replica's engine loop stopped."""
        kind = event[0]
        if kind == "replica":
            self.replica_id = event[1]
            if self.served_by is not None:
                self.served_by.append(event[1])
            return True
        self.heard = True
        if kind == "accepted":
            request_id, error = event[1], decode_error(event[2])
            self.unaccepted.discard(request_id)
            if error is not None:
                self.unfinished.discard(request_id)
            sink.accepted(request_id, error)
        elif kind == "deliver":
            updates, started = event[1], event[2]
            self.unfinished.difference_update(rid for rid, update in updates if update.finished)
            self.unstarted.difference_update(started)
            sink.deliver(updates, started)
        return kind != "stopped"

    def settle(self, sink, message: str, status: int = 503) -> None:
        """Every request not yet settled ends with ``message`` (refused if not yet accepted)."""
        for request_id in list(self.unaccepted):
            sink.accepted(request_id, APIError(status, message, type="server_error", code="service_unavailable"))
            self.unfinished.discard(request_id)
        failed = [(rid, RequestUpdate(finished=True, error=message, status=status)) for rid in self.unfinished]
        if failed or self.unstarted:
            sink.deliver(failed, list(self.unstarted))
        self.unaccepted.clear(), self.unstarted.clear(), self.unfinished.clear()


class RayTransport:
    """``engine_client.Transport`` over a Ray Serve handle to the engine replicas (lives in the ingress)."""

    def __init__(self, handle, info: dict, tokenizer, affinity_tokens: int):
        self.handle = handle.options(stream=True, method_name="generate")
        self.info, self.tokenizer = info, tokenizer
        self.affinity_tokens = affinity_tokens
        self._sink = None
        self._batches: dict[asyncio.Task, BatchState] = {}  # the event loop's thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._abort_message = "the server is shutting down"
        self._closed = False
        self.metrics = RoutingMetrics()

    def start(self, sink) -> None:
        self._sink = sink

    @property
    def is_alive(self) -> bool:
        return not self._closed

    def add(self, requests: list[NewRequest]) -> None:
        """Called on the event loop (``EngineClient.submit``); the batch's call runs as a task of that loop."""
        self._loop = asyncio.get_running_loop()
        state = BatchState(requests, SERVED_BY.get())
        batch = RoutedBatch(requests, affinity_key(requests[0].prompt_token_ids, self.affinity_tokens))
        task = self._loop.create_task(self._run(batch, state))
        self._batches[task] = state
        task.add_done_callback(self._batches.pop)

    async def _run(self, batch: RoutedBatch, state: BatchState) -> None:
        message, status = "the engine replica stopped before this request finished", 503
        try:
            for attempt in range(RESENDS + 1):
                stream = self.handle.remote(batch)
                try:
                    async for event in stream:
                        if not state.apply(self._sink, event):
                            message = event[1]
                            break
                    break
                except asyncio.CancelledError:  # abort_all, close, or nobody waits: abort it on the replica
                    stream.cancel()
                    raise
                except RayActorError as exc:
                    if state.heard or attempt == RESENDS:
                        message = f"the engine replica failed: {type(exc).__name__}"
                        break
                    logger.warning("an engine replica died before it answered; sending the batch again")
        except asyncio.CancelledError:
            message = self._abort_message
        except Exception as exc:  # a failure of this call alone: its requests get the error, the ingress goes on
            logger.exception("a call to an engine replica failed")
            message, status = f"internal error: {type(exc).__name__}: {exc}", 500
        finally:
            state.settle(self._sink, message, status)
            self.metrics.record(state.replica_id, len(state.request_ids))

    def abort(self, request_id: str) -> None:
        """The client stopped waiting for ``request_id``; a batch nobody waits for is cancelled on its replica.
        Thread-safe: the batches belong to the event loop, which does the work."""
        if self._loop is not None:
            call_soon(self._loop, self._abort_on_loop, request_id)

    def _abort_on_loop(self, request_id: str) -> None:
        for task, state in list(self._batches.items()):
            if request_id in state.request_ids:
                state.unfinished.discard(request_id)
                if not state.unfinished:
                    task.cancel()

    def abort_all(self, message: str) -> None:
        """End every batch in flight with ``message`` (a 503); may be called from any thread."""
        self._abort_message = message
        if self._loop is not None:
            call_soon(self._loop, _cancel_all, self._batches)

    async def render_metrics(self) -> bytes:
        return self.metrics.render()

    def close(self, drain_timeout_s: float = 0.0) -> None:
        """Let batches in flight finish for up to ``drain_timeout_s``, then end the rest (runs off the loop)."""
        deadline = time.monotonic() + drain_timeout_s
        while self._batches and time.monotonic() < deadline:
            time.sleep(0.05)
        self.abort_all("the server shut down before this request finished")
        self._closed = True


def _cancel_all(batches: dict[asyncio.Task, BatchState]) -> None:
    for task in list(batches):
        task.cancel()
