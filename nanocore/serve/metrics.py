"""Prometheus metrics of a server (vLLM's names with the ``nanocore:`` prefix), one registry per server."""
from __future__ import annotations

import bisect
import itertools
import math

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """Updated by the engine loop thread after each step; rendered by ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()  # a registry per server: several can live in one process
        p = "nanocore:"
        self.running = Gauge(p + "num_requests_running", "Sequences in the running batch (n per request)",
                             registry=registry)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests accepted but not yet admitted to a step",
                             registry=registry)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full)",
                              registry=registry)
        self.prefix_hit_rate = Gauge(p + "prefix_cache_hit_rate",
                                     "Prompt tokens served by the prefix cache / prompt tokens, since start",
                                     registry=registry)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of added sequences", registry=registry)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=registry)
        self.preemptions = Counter(p + "num_preemptions", "Sequences preempted (KV exhausted, recomputed later)",
                                   registry=registry)
        self.finished = Counter(p + "request_success", "Finished samples by finish reason",
                                ["finished_reason"], registry=registry)
        self.ttft = BucketHistogram(p + "time_to_first_token_seconds", "Arrival to first generated token",
                                    TTFT_BUCKETS)
        self.itl = BucketHistogram(p + "inter_token_latency_seconds", "Time between two tokens of a request",
                                   ITL_BUCKETS)
        self.e2e = BucketHistogram(p + "e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS)
        registry.register(HistogramCollector([self.ttft, self.itl, self.e2e]))
        self._last = {"prompt": 0, "generated": 0, "preemptions": 0}

    def record_step(self, engine, num_waiting: int) -> None:
        stats, block_manager = engine.stats, engine.block_manager
        self.running.set(len(engine.scheduler.running))
        self.waiting.set(num_waiting)
        self.kv_usage.set(1.0 - block_manager.num_free_blocks / block_manager.num_blocks)
        if stats.num_prompt_tokens:
            self.prefix_hit_rate.set(stats.num_cached_tokens / stats.num_prompt_tokens)
        current = {"prompt": stats.num_prompt_tokens, "generated": stats.num_generated_tokens,
                   "preemptions": stats.num_preemptions}
        for key, counter in (("prompt", self.prompt_tokens), ("generated", self.generation_tokens),
                             ("preemptions", self.preemptions)):
            if current[key] > self._last[key]:
                counter.inc(current[key] - self._last[key])
        self._last = current

    def observe_token_times(self, ttft: float | None, inter_token: float | None) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        if inter_token is not None:
            self.itl.observe(inter_token)

    def record_finished(self, finish_reasons: list[str | None], e2e_seconds: float) -> None:
        for reason in finish_reasons:
            self.finished.labels(finished_reason=reason or "unknown").inc()
        self.e2e.observe(e2e_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class BucketHistogram:
    """A Prometheus histogram for one writer thread: an observation is a bisect and an add, no lock (the engine
    loop observes one inter-token latency per request per step)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]):
        self.name, self.documentation = name, documentation
        self.bounds = [*buckets, math.inf]
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # the first bucket with value <= bound
        self.sum += value

    def family(self) -> HistogramMetricFamily:
        cumulative = itertools.accumulate(list(self.counts))
        buckets = [("+Inf" if math.isinf(b) else repr(b), c) for b, c in zip(self.bounds, cumulative)]
        return HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


class HistogramCollector:
    def __init__(self, histograms: list[BucketHistogram]):
        self.histograms = histograms

    def collect(self):
        return [h.family() for h in self.histograms]
