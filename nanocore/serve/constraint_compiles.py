"""Structured-output constraints compile off the engine loop thread, so a large schema never stalls other requests.

A batch whose constraints are not compiled yet waits here while a small pool compiles them into the engine's cache
(``StructuredOutputs.compile``: thread-safe, cached per constraint, refusals cached too); it then goes back to the
loop, whose ``add_request`` finds every constraint compiled. Aborts that arrive meanwhile are remembered, and the
batch is refused when it comes back instead of being run for nobody.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import NewRequest

logger = logging.getLogger("nanocore.serve")

COMPILE_THREADS = 2  # compiles of different schemas run side by side; xgrammar releases the GIL while it works


class ConstraintCompiles:
    def __init__(self, structured, resend: Callable[[list[NewRequest]], None]):
        """``structured``: the engine's ``StructuredOutputs``; ``resend(batch)`` queues a batch back to the loop."""
        self._structured, self._resend = structured, resend
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._waiting: set[str] = set()  # request ids whose batch is compiling
        self._aborted: dict[str, BaseException] = {}  # request id -> why it ended while compiling

    def defer(self, batch: list[NewRequest]) -> bool:
        """Whether ``batch`` waits for compiles (it then comes back through ``resend``)."""
        todo = {new.params.structured_output for new in batch if new.params.structured_output is not None}
        todo = [c for c in todo if not self._structured.is_compiled(c)]
        if not todo:
            return False
        with self._lock:
            self._waiting.update(new.request_id for new in batch)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="nanocore-compile")
        self._pool.submit(self._compile, batch, todo)
        return True

    def _compile(self, batch: list[NewRequest], constraints) -> None:
        for constraint in constraints:
            try:
                self._structured.compile(constraint)
            except ValueError:
                pass  # cached as refused: the loop's add_request raises it, and the client gets its 400
            except Exception:  # a bug in a backend: add_request tries again and reports it for this batch
                logger.exception("compiling a structured-output constraint failed")
        self._resend(batch)

    def abort(self, request_id: str) -> bool:
        """Remember an abort of a compiling request; whether it was one."""
        with self._lock:
            if request_id not in self._waiting:
                return False
            self._aborted[request_id] = RuntimeError("the request was aborted while its constraint compiled")
            return True

    def abort_all(self, message: str) -> None:
        with self._lock:
            for request_id in self._waiting:
                self._aborted[request_id] = APIError(503, message, type="server_error", code="service_unavailable")

    def returned(self, batch: list[NewRequest]) -> BaseException | None:
        """A batch is back from compiling: why it must be refused (an abort meanwhile), else None."""
        with self._lock:
            ids = [new.request_id for new in batch]
            self._waiting.difference_update(ids)
            reasons = [self._aborted.pop(i) for i in ids if i in self._aborted]
        return reasons[0] if reasons else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
