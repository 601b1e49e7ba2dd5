"""Handing results to the asyncio side: per-request queues and their readers, from another thread."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from nanocore.serve.request_state import RequestUpdate, merge_updates


class RequestStream:
    """The asyncio side of one request: iterate its (merged) updates; closing early aborts it."""

    def __init__(self, client, request_id: str, queue: asyncio.Queue):
        self.client, self.request_id, self.queue = client, request_id, queue
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
                self.client.abort(self.request_id)

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
