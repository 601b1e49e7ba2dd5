"""The load generator of ``nanocore bench serve``: streaming completions against a server, timed per token.

Requests arrive as a Poisson process at ``request_rate`` (``inf`` = all at once), at most ``concurrency`` in
flight. Each is a token-id prompt with ``ignore_eos`` and a fixed ``max_tokens``, streamed with usage, so the
time of every chunk is known: TTFT (first chunk), ITL (between chunks), TPOT ((latency - TTFT) / (tokens - 1)).
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    prompt_len: int
    max_tokens: int
    ok: bool = False
    error: str | None = None
    output_tokens: int = 0
    latency_s: float = 0.0
    ttft_s: float | None = None
    itls_s: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


async def stream_one(client, model: str | None, prompt: list[int], max_tokens: int, temperature: float,
                     record: RequestRecord, fields: dict | None = None) -> None:
    """``fields``: more request fields, the same on every request (``response_format``, say)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, **(fields or {})}
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.perf_counter()
                if '"usage":{' in line or '"error":' in line:  # only the last chunks are parsed
                    _read_final(json.loads(line[6:]), record)
                    continue
                if record.ttft_s is None:
                    record.ttft_s = now - start
                else:
                    record.itls_s.append(now - last)
                last = now
        record.latency_s = last - start
        record.ok = record.error is None and record.output_tokens == max_tokens
        if record.error is None and not record.ok:
            record.error = f"got {record.output_tokens} tokens, asked for {max_tokens}"
    except Exception as exc:  # a failed request is a result, not the end of the run
        record.error = f"{type(exc).__name__}: {exc}"


def _read_final(payload: dict, record: RequestRecord) -> None:
    if "error" in payload:
        record.error = payload["error"].get("message")
    elif payload.get("usage"):
        record.output_tokens = payload["usage"]["completion_tokens"]


def arrival_offsets(count: int, request_rate: float, seed: int = 0) -> list[float]:
    """Seconds from the start at which each request is sent: a Poisson process (0 for all at ``inf``)."""
    rng, at, offsets = random.Random(seed), 0.0, []
    for _ in range(count):
        offsets.append(at)
        if math.isfinite(request_rate):
            at += rng.expovariate(request_rate)
    return offsets


async def run_load(url: str, workload: list[tuple[list[int], int]], request_rate: float, concurrency: int | None,
                   temperature: float = 0.6, model: str | None = None, seed: int = 0,
                   api_key: str | None = None, offsets: list[float] | None = None,
                   start_at: float | None = None, fields: dict | None = None) -> tuple[list[RequestRecord], float]:
    """Send every (prompt, output length) of ``workload``; return the records and the wall time.

    ``offsets`` / ``start_at`` (``time.time()``): when each request is sent, for a share of a run that several
    client processes drive together (default: this process's own Poisson schedule, starting now).
    """
    import httpx

    offsets = offsets if offsets is not None else arrival_offsets(len(workload), request_rate, seed)
    limit = asyncio.Semaphore(concurrency or len(workload))
    records = [RequestRecord(len(p), n) for p, n in workload]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0), limits=limits,
                                 headers=headers) as client:
        async def limited(prompt, max_tokens, record):
            async with limit:
                await stream_one(client, model, prompt, max_tokens, temperature, record, fields)

        start = start_at if start_at is not None else time.time()
        tasks = []
        for (prompt, max_tokens), record, offset in zip(workload, records, offsets):
            delay = start + offset - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(limited(prompt, max_tokens, record)))
        await asyncio.gather(*tasks)
    return records, time.time() - start


def _load_share(args: tuple) -> tuple[list[RequestRecord], float]:
    """One client process's share (``run_load`` arguments); returns its records and end time."""
    records, _ = asyncio.run(run_load(*args))
    return records, time.time()


def run_load_processes(url: str, workload: list[tuple[list[int], int]], request_rate: float,
                       concurrency: int | None, temperature: float = 0.6, model: str | None = None, seed: int = 0,
                       api_key: str | None = None, processes: int = 1,
                       fields: dict | None = None) -> tuple[list[RequestRecord], float]:
    """``run_load`` spread over ``processes`` client processes (one Python client cannot parse tens of
    thousands of streamed chunks a second): request i goes to process i % processes at its Poisson time,
    and each process keeps ``concurrency / processes`` requests in flight (the remainder to the first)."""
    processes = max(1, min(processes, len(workload)))
    if processes == 1:
        return asyncio.run(run_load(url, workload, request_rate, concurrency, temperature, model, seed, api_key,
                                    fields=fields))
    import multiprocessing

    offsets = arrival_offsets(len(workload), request_rate, seed)
    start_at = time.time() + 2.0  # every process is up and importing before the first request is due
    shares = []
    for k in range(processes):
        share_limit = None if concurrency is None else max(1, concurrency // processes
                                                           + (k < concurrency % processes))
        shares.append((url, workload[k::processes], request_rate, share_limit, temperature, model, seed, api_key,
                       offsets[k::processes], start_at, fields))
    with multiprocessing.get_context("spawn").Pool(processes) as pool:  # spawn: the parent may hold a server
        results = pool.map(_load_share, shares)
    records: list[RequestRecord] = [None] * len(workload)  # back in workload order
    for k, (share_records, _) in enumerate(results):
        records[k::processes] = share_records
    return records, max(end for _, end in results) - start_at


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(records: list[RequestRecord], seconds: float) -> dict:
    """Throughputs and TTFT / TPOT / ITL percentiles in milliseconds, over the requests that completed."""
    done = [r for r in records if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    summary = {"requests": len(records), "completed": len(done), "failed": len(records) - len(done),
               "seconds": seconds, "request_throughput": len(done) / seconds,
               "output_tokens": output_tokens, "output_tokens_per_s": output_tokens / seconds,
               "total_tokens_per_s": (output_tokens + sum(r.prompt_len for r in done)) / seconds}
    series = {"ttft": [r.ttft_s for r in done if r.ttft_s is not None],
              "tpot": [r.tpot_s for r in done if r.tpot_s is not None],
              "itl": [gap for r in done for gap in r.itls_s]}
    for name, values in series.items():
        for q in PERCENTILES:
            value = percentile(values, q)
            summary[f"{name}_p{q}_ms"] = None if value is None else value * 1000
    errors = [r.error for r in records if r.error]
    summary["first_error"] = errors[0] if errors else None
    return summary
