"""Generation loops run with the heap that exists when they start frozen out of the cyclic GC's scans."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def frozen_heap() -> Iterator[None]:
    """``gc.freeze()`` for the loop's duration, ``gc.unfreeze()`` after (vLLM freezes its engine process's heap).

    A full (generation-2) collection scans every tracked object: with a model, its kernels and CUDA graphs built that is
    ~440K objects, and on the H200 one such collection took 275 ms inside a 5.6 s `bench throughput` pass (session 17,
    `benchmarks.gc_pauses`); with the heap frozen no full collection ran in the pass. New objects are still collected;
    unfreezing after the loop lets an engine dropped later be collected. A process that froze its heap itself (or
    disabled the GC), and nested loops, are left as they are.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
