"""nanocore bench serve: served throughput and TTFT / TPOT / ITL through the OpenAI API (load: serve_load.py).

Against a running server (--url) or one the bench starts from the engine flags: --server process (a child
'nanocore serve', the default: the load generator does not share the server's interpreter) or --server thread
(an in-process uvicorn thread). Every request streams a token-id prompt of the Nano-vLLM workload (lengths
uniform in --min-len..--max-len, ignore EOS). Each value of --request-rate x --concurrency is one timed run
(one table row) on the same server; --compare-offline then runs the offline pass of 'bench throughput' on the same
config and workload after the server stopped, and reports served / offline output tok/s. --json writes it all.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = """examples:
  # a server the bench starts (child process) on dummy Qwen3-0.6B shapes; concurrency 256, then Poisson rates:
  nanocore bench serve --model dummy:Qwen3-0.6B --device cuda --concurrency 256 --compare-offline --json c256.json
  nanocore bench serve --model dummy:Qwen3-0.6B --device cuda --request-rate 4,16,64 --json rates.json
  # the same with the server in this process (an in-process uvicorn thread):
  nanocore bench serve --server thread --model dummy:Qwen3-0.6B --device cuda --concurrency 256 --compare-offline \\
      --json c256_thread.json
  nanocore bench serve --server thread --model dummy:Qwen3-0.6B --device cuda --request-rate 4,16,64 \\
      --json rates_thread.json
  # an already running server (nanocore serve, or any OpenAI-compatible one that accepts token-id prompts):
  nanocore bench serve --url http://127.0.0.1:8000 --vocab-size 151936 --request-rate 16
"""
COLUMNS = ["request_rate", "concurrency", "completed", "failed", "seconds", "request_throughput",
           "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description, p.epilog = __doc__, EXAMPLES
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--url", help="a running server's base URL (default: start one from the engine flags)")
    p.add_argument("--server", choices=["process", "thread"], default="process",
                   help="without --url: a child 'nanocore serve' process (default) or an in-process uvicorn thread")
    p.add_argument("--api-key", default=None, help="API key of the server at --url")
    p.add_argument("--served-model-name", default=None, help="model name to send (default: the server's)")
    p.add_argument("--vocab-size", type=int, default=None, help="with --url: token ids stay below it "
                                                                "(default: the server's /version)")
    p.add_argument("--request-rate", default="inf",
                   help="requests/s of Poisson arrivals, comma-separated for several runs; inf = all at once")
    p.add_argument("--concurrency", default=None, help="most requests in flight, comma-separated for several runs")
    p.add_argument("--num-prompts", type=int, default=256, help="requests per run (default 256, Nano-vLLM's)")
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt / output (default 100)")
    p.add_argument("--max-len", type=int, default=1024, help="longest prompt / output (default 1024)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--json-schema", default=None, metavar="FILE_OR_JSON",
                   help="send every request with this JSON schema as its response_format (the masking cost; a schema "
                        "that cannot close early, e.g. an array with a large minItems, keeps output lengths fixed)")
    p.add_argument("--workload-seed", type=int, default=0, help="seed of the workload and the arrivals (default 0)")
    p.add_argument("--warmup", choices=["full", "one", "none"], default="full",
                   help="untimed pass first: the workload with shifted ids (default), one request, or none")
    p.add_argument("--compare-offline", action="store_true",
                   help="also run the offline throughput pass on the same config and report served / offline")
    p.add_argument("--client-processes", type=int, default=None,
                   help="load-generator processes (default: a quarter of the CPU cores, 1 to 8): one Python "
                        "client parsing every streamed chunk would be the bottleneck of a fast server")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="without --url: the server's tokens per streamed chunk after the first (default 1)")
    p.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for the server (default 900)")


def parse_list(text: str | None, cast) -> list:
    return [None] if text is None else [cast(part) for part in str(text).split(",") if part.strip()]


def run_from_args(args, config) -> int:
    """``config``: the EngineConfig of the server to start (None with ``--url``)."""
    from nanocore.bench.report import config_summary, environment, format_table, write_json

    rates, concurrencies = parse_list(args.request_rate, float), parse_list(args.concurrency, int)
    with server_url(args, config) as (url, info):
        workload = build_workload(args, args.vocab_size or info.get("vocab_size"))
        model = args.served_model_name or info.get("served_model_name")
        warm_up(url, workload, args, model)
        rows = []
        for rate in rates:
            for concurrency in concurrencies:
                rows.append({"request_rate": rate if math.isfinite(rate) else "inf", "concurrency": concurrency,
                             **timed_run(url, workload, args, rate, concurrency, model)})
    offline = run_offline(config, args) if args.compare_offline and config is not None else None
    if offline:
        for row in rows:
            row["served_over_offline"] = row["output_tokens_per_s"] / offline["output_tokens_per_s"]
    print(format_table(rows, COLUMNS + (["served_over_offline"] if offline else [])))
    write_json(args.json, {
        "command": "bench serve", "url": args.url, "server": None if args.url else args.server,
        "stream_interval": None if args.url else args.stream_interval, "client_processes": client_processes(args),
        "workload": {"num_prompts": args.num_prompts, "min_len": args.min_len, "max_len": args.max_len,
                     "temperature": args.temperature, "seed": args.workload_seed, "ignore_eos": True,
                     "request_fields": request_fields(args)},
        "rows": rows, "offline": offline, "server_info": info,
        "config": config_summary(config) if config else None, "environment": environment(info.get("device"))})
    return 0 if all(r["failed"] == 0 for r in rows) else 1


def build_workload(args, vocab_size: int | None):
    from nanocore.bench.throughput import make_workload

    if not vocab_size:
        raise ValueError("the server does not report vocab_size; pass --vocab-size")
    return make_workload(args.num_prompts, args.min_len, args.max_len, vocab_size, args.workload_seed)


def request_fields(args) -> dict:
    """Fields every request carries beyond the workload's: ``--json-schema`` as a ``response_format``."""
    if args.json_schema is None:
        return {}
    text = Path(args.json_schema).read_text() if Path(args.json_schema).is_file() else args.json_schema
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--json-schema is neither a file nor JSON ({exc})") from None
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}}


def client_processes(args) -> int:
    if args.client_processes is not None:
        if args.client_processes < 1:
            raise ValueError(f"--client-processes must be >= 1, got {args.client_processes}")
        return args.client_processes
    return max(1, min(8, (os.cpu_count() or 1) // 4))


def warm_up(url: str, workload, args, model) -> None:
    from nanocore.bench.serve_load import run_load_processes

    if args.warmup == "none":
        return
    vocab = max(t for p, _ in workload for t in p) + 2
    shifted = [([(t + 1) % vocab for t in p], n) for p, n in workload]  # same shapes, no prefix-cache hits
    run_load_processes(url, shifted if args.warmup == "full" else shifted[:1], float("inf"), None,
                       args.temperature, model, args.workload_seed, args.api_key, client_processes(args),
                       request_fields(args))


def timed_run(url: str, workload, args, rate: float, concurrency: int | None, model) -> dict:
    from nanocore.bench.serve_load import run_load_processes, summarize

    processes = client_processes(args)
    records, seconds = run_load_processes(url, workload, rate, concurrency, args.temperature, model,
                                          args.workload_seed, args.api_key, processes, request_fields(args))
    return {**summarize(records, seconds), "client_processes": processes}


def run_offline(config, args) -> dict:
    """``bench throughput``'s pass (same workload, warm-up and temperature) in this process."""
    from dataclasses import asdict

    from nanocore.bench.prefix import free_device_memory
    from nanocore.bench.throughput import run_throughput
    from nanocore.engine.llm import LLM

    free_device_memory()  # an in-process server's engine is gone; its memory goes back before this one profiles
    llm = LLM(config=config)
    result = run_throughput(llm, args.num_prompts, args.min_len, args.max_len, args.temperature,
                            args.workload_seed, warmup=args.warmup)
    llm.close()
    return asdict(result)


@contextlib.contextmanager
def server_url(args, config):
    """(base URL, the server's /version) of the server to load: --url, or one started here and stopped after."""
    if args.url:
        yield args.url.rstrip("/"), server_info(args.url.rstrip("/"))
    elif args.server == "thread":
        with thread_server(config, args.stream_interval) as url:
            yield url, server_info(url)
    else:
        with process_server(config, args.startup_timeout, getattr(args, "threads", None), args.stream_interval) as url:
            yield url, server_info(url)


def server_info(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/version", timeout=30).json()


@contextlib.contextmanager
def thread_server(config, stream_interval: int = 1):
    from nanocore.engine.llm import LLM
    from nanocore.serve.server import GIL_SWITCH_INTERVAL_S, ServerThread, create_app

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as 'nanocore serve' does
    app = create_app(LLM(config=config), max_waiting_requests=1 << 20, stream_interval=stream_interval)
    with ServerThread(app, startup_timeout_s=60) as url:
        yield url


@contextlib.contextmanager
def process_server(config, startup_timeout_s: float, threads: int | None = None, stream_interval: int = 1):
    """A child ``nanocore serve`` on a free port with ``config`` written to a TOML file."""
    from nanocore.serve.server import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "engine.toml")
        with open(path, "w") as f:
            f.write(config_toml(config))
        command = [sys.executable, "-m", "nanocore.cli.main", "serve", "--config", path, "--port", str(port),
                   "--max-waiting-requests", str(1 << 20), "--stream-interval", str(stream_interval),
                   "--log-level", "warning"]
        command += ["--threads", str(threads)] if threads else []
        proc = subprocess.Popen(command)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_health(url, proc, startup_timeout_s)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_for_health(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} was not ready after {timeout_s:.0f} s (--startup-timeout)")


def config_toml(config) -> str:
    """The resolved EngineConfig as TOML (the child's NANOCORE_* environment gives the same values again)."""
    lines = []
    for key, value in json.loads(config.model_dump_json()).items():
        if value is None:
            continue
        if isinstance(value, dict):
            items = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{{items}}}" if items else f"{key} = {{}}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"
