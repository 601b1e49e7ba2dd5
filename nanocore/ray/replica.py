"""One engine replica: the server's ``EngineLoop`` over its own ``LLM``, serving batches as event streams.

``generate(batch)`` adds a ``RoutedBatch`` to the loop and yields what the loop reports for it, as plain tuples the
ingress hands to its engine client (``transport.py``): ``("replica", id)`` first, then ``("accepted", request_id,
error)``, ``("deliver", updates, started)`` and ``("stopped", message)``. The stream ends once every request of the
batch has finished (or was refused); cancelling it aborts what is left.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from ray import serve

from nanocore.config import EngineConfig
from nanocore.engine.llm import LLM
from nanocore.serve.delivery import call_soon
from nanocore.serve.engine_loop import EngineLoop
from nanocore.serve.engine_process import encode_error
from nanocore.ray.routing import RoutedBatch


class ReplicaSink:
    """The engine loop's ``ResultSink``: each request's events go to the queue of the stream that added it."""

    def __init__(self) -> None:
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()  # the loop thread reports while streams come and go

    def open(self, request_ids: list[str]) -> asyncio.Queue:
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        with self._lock:
            self._streams.update((request_id, (loop, queue)) for request_id in request_ids)
        return queue

    def close(self, request_ids: list[str]) -> None:
        with self._lock:
            for request_id in request_ids:
                self._streams.pop(request_id, None)

    def accepted(self, request_id: str, error: BaseException | None) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            call_soon(stream[0], stream[1].put_nowait, ("accepted", request_id, encode_error(error)))

    def deliver(self, updates, started: list[str]) -> None:
        by_stream: dict[int, tuple[Any, list, list]] = {}
        with self._lock:
            for request_id, update in updates:
                stream = self._streams.get(request_id)
                if stream is not None:
                    by_stream.setdefault(id(stream[1]), (stream, [], []))[1].append((request_id, update))
            for request_id in started:
                stream = self._streams.get(request_id)
                if stream is not None:
                    by_stream.setdefault(id(stream[1]), (stream, [], []))[2].append(request_id)
        for (loop, queue), stream_updates, stream_started in by_stream.values():
            call_soon(loop, queue.put_nowait, ("deliver", stream_updates, stream_started))

    def stopped(self, message: str) -> None:
        with self._lock:
            streams = {id(queue): (loop, queue) for loop, queue in self._streams.values()}
        for loop, queue in streams.values():
            call_soon(loop, queue.put_nowait, ("stopped", message))


class EngineReplica:
    """A Ray Serve deployment class (``app.py`` applies the options): one engine per replica."""

    def __init__(self, config: dict, stream_interval: int = 1):
        engine_config = EngineConfig(**config)  # validating the names loads the plugins here, from entry points
        self.loop = EngineLoop(LLM(config=engine_config), stream_interval=stream_interval)
        self.sink = ReplicaSink()
        self.loop.start(self.sink)
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    def describe(self) -> tuple[dict, Any]:
        """What the ingress's routes need: the engine's info (``engine_info.describe``) and tokenizer."""
        return self.loop.info, self.loop.tokenizer

    def check_health(self) -> None:
        """Ray Serve calls this every ``health_check_period_s``; raising gets the replica replaced."""
        if not self.loop.is_alive:
            raise RuntimeError("the engine loop has stopped")

    async def generate(self, batch: RoutedBatch):
        # arrival times are this host's clock (the ingress may run on another host)
        requests = [r._replace(arrival_time=time.perf_counter()) for r in batch.requests]
        request_ids = [r.request_id for r in requests]
        unfinished, unstarted = set(request_ids), set(request_ids)
        queue = self.sink.open(request_ids)
        try:
            yield ("replica", self.replica_id)
            self.loop.add(requests)
            while unfinished or unstarted:
                event = await queue.get()
                if event[0] == "accepted" and event[2] is not None:
                    unfinished.discard(event[1])
                elif event[0] == "deliver":
                    unfinished.difference_update(rid for rid, update in event[1] if update.finished)
                    unstarted.difference_update(event[2])
                yield event
                if event[0] == "stopped":
                    return
        finally:
            self.sink.close(request_ids)
            for request_id in unfinished:  # the ingress went away (cancelled the stream): free the KV blocks
                self.loop.abort(request_id)

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.close(0.0)
