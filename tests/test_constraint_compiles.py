"""Constraints compile off the engine loop: batches wait, come back once, and aborts meanwhile refuse them."""
from __future__ import annotations

import queue
import threading

from nanocore.engine.sampling_params import SamplingParams
from nanocore.interfaces import Constraint
from nanocore.serve.constraint_compiles import ConstraintCompiles
from nanocore.serve.protocol import APIError
from nanocore.serve.request_state import NewRequest


class GatedCache:
    """The engine's compile cache, with compiles that wait for a gate."""

    def __init__(self):
        self.done, self.gate, self.calls = set(), threading.Event(), []

    def is_compiled(self, constraint):
        return constraint in self.done

    def compile(self, constraint):
        self.calls.append(constraint)
        self.gate.wait(10)
        self.done.add(constraint)
        if constraint.kind == "regex":
            raise ValueError("the backend refuses it")


def request(request_id: str, constraint=None) -> NewRequest:
    return NewRequest(request_id, [1, 2], SamplingParams(structured_output=constraint), False, 0.0)


def test_batches_wait_for_their_compiles_and_come_back_once():
    cache, back = GatedCache(), queue.Queue()
    compiles = ConstraintCompiles(cache, back.put)
    schema, pattern = Constraint.json_schema({"type": "object"}), Constraint("regex", "a+")
    assert not compiles.defer([request("plain")])  # nothing to compile: added at once
    batch = [request("a", schema), request("b", pattern), request("c", schema)]
    assert compiles.defer(batch)
    assert back.empty()
    cache.gate.set()
    assert back.get(timeout=10) == batch and back.empty()
    assert sorted(c.kind for c in cache.calls) == ["json_schema", "regex"]  # each distinct constraint once
    assert compiles.returned(batch) is None  # a refusal is the engine's add_request's to report (a 400)
    assert not compiles.defer(batch)  # compiled (or refused) now: no second trip
    compiles.close()


def test_an_abort_while_compiling_refuses_the_batch_when_it_returns():
    cache, back = GatedCache(), queue.Queue()
    compiles = ConstraintCompiles(cache, back.put)
    batch = [request("x", Constraint.json_schema({"type": "integer"}))]
    assert compiles.defer(batch)
    assert compiles.abort("x") and not compiles.abort("not-compiling")
    cache.gate.set()
    assert "aborted" in str(compiles.returned(back.get(timeout=10)))
    later = [request("y", Constraint.json_schema({"type": "string"}))]
    cache.gate.clear()
    assert compiles.defer(later)
    compiles.abort_all("the server is shutting down")
    cache.gate.set()
    refusal = compiles.returned(back.get(timeout=10))
    assert isinstance(refusal, APIError) and refusal.status == 503
    compiles.close()
