"""Generation loops run with the startup heap frozen out of the cyclic GC's full scans (nanocore/runner/heap.py)."""
from __future__ import annotations

import gc
import sys
import threading
import weakref
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import running_server, tiny_llm  # noqa: E402
from nanocore.bench.interference import run_scenario  # noqa: E402
from nanocore.bench.latency import one_request_timeline  # noqa: E402
from nanocore.runner.heap import frozen_heap  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402


def record_freeze_counts(llm) -> list[int]:
    """The process's frozen-object count at every engine step of ``llm`` (patched on the instance)."""
    counts, step = [], llm.engine.step

    def counting_step():
        counts.append(gc.get_freeze_count())
        return step()

    llm.engine.step = counting_step
    return counts


def test_frozen_for_the_loop_then_unfrozen_and_nested_loops_keep_it():
    assert gc.get_freeze_count() == 0, "the test process froze its heap: these checks need an unfrozen one"
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        # frozen objects that die meanwhile (threads earlier tests left behind) lower the count a little; an
        # unfreeze by the inner loop would take it to 0
        with frozen_heap():
            assert gc.get_freeze_count() > frozen * 0.99
        assert gc.get_freeze_count() > frozen * 0.99  # the inner loop did not unfreeze the outer one's heap
    assert gc.get_freeze_count() == 0


def test_an_exception_in_the_loop_still_unfreezes():
    with pytest.raises(KeyError):
        with frozen_heap():
            assert gc.get_freeze_count() > 0
            raise KeyError("a failed step")
    assert gc.get_freeze_count() == 0


def test_loops_in_two_threads_share_one_freeze_until_the_last_ends():
    inside, leave = threading.Event(), threading.Event()

    def server_loop():
        with frozen_heap(collect_first=True):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=server_loop)
    with frozen_heap():  # a generate() already running when the server loop starts
        thread.start()
        assert inside.wait(10)
    assert gc.get_freeze_count() > 0  # the generate ended first: still frozen for the server loop
    leave.set()
    thread.join(10)
    assert gc.get_freeze_count() == 0


def test_a_heap_the_process_froze_or_a_disabled_gc_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == frozen  # not unfrozen by us
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_generate_and_the_latency_bench_step_with_the_heap_frozen_and_the_engine_is_still_collected():
    llm = tiny_llm()
    llm.engine.itself = llm.engine  # a reference cycle: only the GC frees it
    counts = record_freeze_counts(llm)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert counts and min(counts) > 0 and gc.get_freeze_count() == 0
    for timed_loop in (lambda: one_request_timeline(llm.engine, [4, 5, 6], 4),
                       lambda: run_scenario(llm.engine, [4, 5, 6], [7, 8], 4, 2)):  # bench latency, interference
        counts.clear()
        timed_loop()
        assert counts and min(counts) > 0 and gc.get_freeze_count() == 0
    engine = weakref.ref(llm.engine)
    del llm, counts
    gc.collect()
    assert engine() is None  # unfrozen after the loop: an engine in reference cycles is still freed


def test_the_server_loop_steps_with_the_heap_frozen_until_it_stops():
    llm = tiny_llm()
    counts = record_freeze_counts(llm)
    with running_server(llm, served_model_name="tiny") as (url, _):
        reply = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4,
                                                          "ignore_eos": True}, timeout=60)
        assert reply.status_code == 200, reply.text
    assert counts and min(counts) > 0 and gc.get_freeze_count() == 0


def test_a_tensor_parallel_worker_serves_rank_zero_with_the_heap_frozen():
    from nanocore.runner.step_plan import StepPlan, encode_plan
    from nanocore.runner.wire import encode_message
    from nanocore.runner.worker_process import Worker

    messages = [encode_message("execute", encode_plan(StepPlan([])))]  # rank 0's pipe: one call, then gone

    def receive():
        if not messages:
            raise EOFError
        return messages.pop()

    class Runner:
        def execute(self, plan):
            counts.append(gc.get_freeze_count())

    worker, counts = Worker.__new__(Worker), []
    worker.rank, worker.runner = 1, Runner()
    worker.stepper = worker.runner  # no pipeline stages: the runner runs each call
    assert worker.serve(receive) is False  # the pipe closed: no exit call
    assert counts and counts[0] > 0 and gc.get_freeze_count() == 0
