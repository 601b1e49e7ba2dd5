"""GPU timers shared by the benchmarks: CUDA-event medians of a launched call, and of a captured CUDA graph."""
from __future__ import annotations

from typing import Callable

import torch


def time_ms(fn: Callable, min_iters: int = 5, budget_ms: float = 200.0, before: Callable | None = None) -> float:
    """Median of CUDA-event timings of ``fn`` after warm-up, bounded by a small time budget; ``before`` runs ahead
    of each timed call, outside the events (e.g. an L2 flush)."""
    for _ in range(2):
        fn()
    times: list[float] = []
    while len(times) < min_iters or (sum(times) < budget_ms and len(times) < 100):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def capture(fn: Callable) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured once, after a warm-up on a side stream (compiles, workspaces); returns (graph, its output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_replay(fn: Callable) -> Callable:
    """The replay of ``fn`` captured in a CUDA graph."""
    return capture(fn)[0].replay


def graph_time_ms(fn: Callable, min_iters: int = 20) -> float:
    """Median milliseconds of ``fn`` replayed as a CUDA graph (no Python launch cost, as in graph-captured decode),
    after an L2 flush each time so weights come from HBM as in a real forward."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    return time_ms(graph_replay(fn), min_iters=min_iters, budget_ms=0.0, before=flush.zero_)
