"""Handing results from an engine loop thread to the asyncio side: per-request queues and their readers."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import RequestUpdate, TrackedRequest, merge_updates


def check_admission(accepting: bool, closed: bool, num_waiting: int, limit: int) -> None:
    """A new request's refusal, shared by both engine fronts: 503 while shutting down, 429 over the queue limit."""
    if not accepting or closed:
        raise APIError(503, "the server is shutting down", type="server_error", code="service_unavailable")
    if num_waiting >= limit:
        raise APIError(429, f"too many waiting requests ({num_waiting}, limit {limit}); retry later",
                       type="rate_limit_error", code="rate_limit_exceeded")


class LoopSink:
    """Results of the loop thread to the asyncio side of this process: each request's event loop and queue."""

    def accepted(self, tracked: TrackedRequest, exc: BaseException | None) -> None:
        call_soon(tracked.loop, settle, tracked.accepted, exc)

    def deliver(self, ready: list[tuple[TrackedRequest, RequestUpdate]]) -> None:
        deliver_by_loop((tracked.loop, tracked.queue, update) for tracked, update in ready)

    def started(self, tracked: TrackedRequest) -> None:
        pass  # the AsyncEngine counts its own waiting requests


class RequestStream:
    """The asyncio side of one request: iterate its (merged) updates; closing early aborts it."""

    def __init__(self, front, request_id: str, queue: asyncio.Queue):
        self.front, self.request_id, self.queue = front, request_id, queue
        self.finished = False

    async def updates(self) -> AsyncIterator[RequestUpdate]:
        queue = self.queue
        try:
            while not self.finished:
                pending = [await queue.get()]
                while not queue.empty():  # a slow reader gets what piled up as one update
                    pending.append(queue.get_nowait())
                update = merge_updates(pending)
                self.finished = update.finished
                yield update
        finally:
            if not self.finished:  # the client went away (or the handler failed): free the KV blocks now
                self.front.abort(self.request_id)

    async def result(self) -> RequestUpdate:
        """Wait for the end; the last update carries the whole output."""
        last = None
        async for update in self.updates():
            last = update
        return last


def settle(future: asyncio.Future, exc: BaseException | None) -> None:
    if not future.done():
        future.set_exception(exc) if exc is not None else future.set_result(None)


def deliver(items: list) -> None:
    for queue, update in items:
        queue.put_nowait(update)


def deliver_by_loop(updates) -> None:
    """``(event loop, queue, update)`` triples handed over with one call per event loop (once per step)."""
    batches: dict[asyncio.AbstractEventLoop, list] = {}
    for loop, queue, update in updates:
        batches.setdefault(loop, []).append((queue, update))
    for loop, items in batches.items():
        call_soon(loop, deliver, items)


def call_soon(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the event loop already closed (shutdown): nobody is listening
        pass
