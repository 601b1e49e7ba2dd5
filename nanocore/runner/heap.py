"""Generation loops run with the heap that exists when they start frozen out of the cyclic GC's scans."""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.RLock()  # re-entrant: a finalizer run by gc.collect() below may enter a loop
_depth = 0  # loops inside frozen_heap now, in any thread
_froze = False  # whether the outermost of them froze the heap (else the process had, or the GC is off)


@contextmanager
def frozen_heap(collect_first: bool = False) -> Iterator[None]:
    """``gc.freeze()`` while any generation loop runs, ``gc.unfreeze()`` when the last one ends.

    A full (generation-2) collection scans every tracked object: with a model, its kernels and CUDA graphs built that is
    ~440K objects, and on the H200 one took 275 ms inside a 5.6 s `bench throughput` pass (`benchmarks.gc_pauses`;
    with the heap frozen once after the engine was built, no full collection ran in the pass).
    New objects are still collected; unfreezing after the loop lets an engine dropped later, even in a reference cycle,
    be collected. Loops in several threads share one freeze (a depth count). A process that froze its heap itself, or
    disabled the GC, is left as it is. ``collect_first``: collect before freezing (a long-lived loop, the server's:
    garbage frozen now would stay for its lifetime).
    """
    global _depth, _froze
    with _lock:
        _depth += 1
        if _depth == 1:
            _froze = gc.isenabled() and not gc.get_freeze_count()
            if _froze:
                if collect_first:
                    gc.collect()
                gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _froze:
                gc.unfreeze()
                _froze = False
