"""``nanocore bench interference``: how much a long prompt arriving stalls a running decode.

Request A (``--a-prompt-len`` 32 tokens, ``--a-output-len`` 128) decodes; request B (``--b-prompt-len``
tokens, 1 output token) is added once A has ``--b-arrive-after`` 8 output tokens. The engine is driven
step by step and every A token is timestamped (after a device synchronize). Per scheduling mode we report
A's max and median inter-token latency and B's time to first token. Each mode builds its own engine over
one loaded model, runs the scenario ``--warmup`` times unmeasured (kernel compilation, allocator) and
then once measured. The token budget is ``b_prompt_len + a_prompt_len`` in every mode, so only the
policy and its chunk size differ.
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

from nanocore.runner.heap import frozen_heap

#: name -> (scheduler policy, its options); "no_chunking" runs B's whole prompt in one step.
MODES = {
    "no_chunking": ("prefill_first", {}),
    "prefill_first_chunk128": ("prefill_first", {"chunk_size": 128}),
    "decode_first_chunk128": ("decode_first", {"chunk_size": 128}),
    "decode_first_chunk1024": ("decode_first", {"chunk_size": 1024}),
}
COLUMNS = ["mode", "policy", "chunk_size", "a_max_itl_ms", "a_median_itl_ms", "a_max_over_median", "b_ttft_ms",
           "steps"]


@dataclass
class Timeline:
    """Milliseconds since A was added: each A token, B's arrival and B's first token."""

    a_token_ms: list[float] = field(default_factory=list)
    a_token_steps: list[int] = field(default_factory=list)  # engine step (1-based) that produced each A token
    b_arrival_ms: float | None = None
    b_first_token_ms: float | None = None
    steps: int = 0

    @property
    def a_itl_ms(self) -> list[float]:
        return [b - a for a, b in zip(self.a_token_ms, self.a_token_ms[1:])]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--b-prompt-len", type=int, default=32768, help="B's prompt tokens (2048, 8192, 16384, 32768; "
                   "default 32768)")
    p.add_argument("--a-prompt-len", type=int, default=32, help="A's prompt tokens (default 32)")
    p.add_argument("--a-output-len", type=int, default=128, help="A's output tokens (default 128)")
    p.add_argument("--b-arrive-after", type=int, default=8, help="add B once A has this many tokens (default 8)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {list(MODES)}")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured runs of the scenario per mode (default 1)")
    p.add_argument("--workload-seed", type=int, default=0, help="seed of the random prompts (default 0)")
    p.add_argument("--plot", metavar="PATH", help="draw A's token timeline per mode into a PNG (needs matplotlib)")


def check_args(args: argparse.Namespace) -> list[str]:
    """The selected modes; a user error raises ValueError saying what to change."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown mode(s) {unknown or modes}; choose from {list(MODES)}")
    if min(args.b_prompt_len, args.a_prompt_len, args.a_output_len) < 1:
        raise ValueError("--b-prompt-len, --a-prompt-len and --a-output-len must be >= 1")
    if not 1 <= args.b_arrive_after < args.a_output_len:
        raise ValueError(f"--b-arrive-after must be in [1, {args.a_output_len}) so A is still decoding when B arrives")
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    return modes


def make_prompts(vocab_size: int, a_len: int, b_len: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(a_len)], [rng.randrange(vocab_size) for _ in range(b_len)]


def run_scenario(engine, a_prompt: list[int], b_prompt: list[int], a_output_len: int, b_arrive_after: int) -> Timeline:
    """Drive ``engine`` step by step: A decodes, B joins after A's ``b_arrive_after``-th token."""
    import torch

    from nanocore.engine.sampling_params import SamplingParams

    cuda = engine.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(engine.device)) if cuda else (lambda: None)  # noqa: E731
    greedy = dict(temperature=0.0, ignore_eos=True)
    timeline = Timeline()
    sync()
    with frozen_heap():  # as LLM.generate: no full GC scan of the model's heap inside the timeline
        start = time.perf_counter()
        a_seq = engine.add_request(a_prompt, SamplingParams(max_tokens=a_output_len, **greedy)).seqs[0]
        b_seq = None
        while engine.has_unfinished_requests():
            engine.step()
            sync()
            now_ms = (time.perf_counter() - start) * 1e3
            timeline.steps += 1
            if a_seq.num_output_tokens > len(timeline.a_token_ms):
                timeline.a_token_ms.append(now_ms)
                timeline.a_token_steps.append(timeline.steps)
            if b_seq is not None and timeline.b_first_token_ms is None and b_seq.num_output_tokens:
                timeline.b_first_token_ms = now_ms
            if b_seq is None and a_seq.num_output_tokens >= b_arrive_after:
                b_seq = engine.add_request(b_prompt, SamplingParams(max_tokens=1, **greedy)).seqs[0]
                timeline.b_arrival_ms = (time.perf_counter() - start) * 1e3
    return timeline


def summarise(mode: str, timeline: Timeline) -> dict:
    policy, options = MODES[mode]
    itl = timeline.a_itl_ms
    median = statistics.median(itl) if itl else None
    return {"mode": mode, "policy": policy, "chunk_size": options.get("chunk_size"),
            "a_max_itl_ms": max(itl) if itl else None, "a_median_itl_ms": median,
            "a_max_over_median": max(itl) / median if itl and median else None,
            "b_ttft_ms": timeline.b_first_token_ms - timeline.b_arrival_ms, "steps": timeline.steps,
            "timeline": asdict(timeline)}


def run_mode(config, loaded, mode: str, a_prompt, b_prompt, args) -> dict:
    """Fresh engine for ``mode`` over the shared loaded model; warm-up runs, then one measured run."""
    import torch

    from nanocore.engine.llm_engine import LLMEngine

    policy, options = MODES[mode]
    engine = LLMEngine(config.model_copy(update={"scheduler_policy": policy, "scheduler_policy_options": options}),
                       loaded_model=loaded)
    try:
        for _ in range(args.warmup):
            run_scenario(engine, a_prompt, b_prompt, args.a_output_len, args.b_arrive_after)
        return summarise(mode, run_scenario(engine, a_prompt, b_prompt, args.a_output_len, args.b_arrive_after))
    finally:
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next mode's engine sizes its KV cache from free memory


def bench_config(args: argparse.Namespace):
    """The engine config every mode shares: budget >= B's prompt, no prefix cache (B must prefill)."""
    from nanocore.cli.common import engine_config_from_args

    longest = max(args.b_prompt_len + 1, args.a_prompt_len + args.a_output_len)
    extra = {"max_num_batched_tokens": args.b_prompt_len + args.a_prompt_len, "prefix_cache": "none",
             "scheduler_policy": "prefill_first"}
    if args.max_model_len is None:
        extra["max_model_len"] = longest
    if args.max_num_seqs is None:
        extra["max_num_seqs"] = 2  # two requests: fewer CUDA-graph buckets to capture
    config = engine_config_from_args(args, **extra)
    if config.max_model_len < longest:
        raise ValueError(f"--max-model-len {config.max_model_len} is below the {longest} tokens this scenario needs; "
                         f"raise it or lower --b-prompt-len")
    return config


def run_interference_cmd(args: argparse.Namespace) -> int:
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.distributed.parallel import ParallelContext
    from nanocore.engine.llm_engine import resolve_device
    from nanocore.loader import load_model

    modes = check_args(args)
    config = bench_config(args)
    device = resolve_device(config.device)
    loaded = load_model(config, device, ParallelContext())
    a_prompt, b_prompt = make_prompts(loaded.hf_config.vocab_size, args.a_prompt_len, args.b_prompt_len,
                                      args.workload_seed)
    rows = []
    for mode in modes:
        rows.append(run_mode(config, loaded, mode, a_prompt, b_prompt, args))
        print(f"{mode}: A max ITL {rows[-1]['a_max_itl_ms']:.1f} ms, B TTFT {rows[-1]['b_ttft_ms']:.1f} ms", flush=True)
    print(format_table(rows, COLUMNS))
    workload = {"a_prompt_len": args.a_prompt_len, "a_output_len": args.a_output_len, "b_prompt_len": args.b_prompt_len,
                "b_output_len": 1, "b_arrive_after": args.b_arrive_after, "warmup": args.warmup,
                "seed": args.workload_seed, "greedy": True}
    write_json(args.json, {"command": "bench interference", "workload": workload, "results": rows,
                           "config": config_summary(config), "environment": environment(str(device))})
    if args.plot:
        from nanocore.bench.interference_plot import plot_timelines
        plot_timelines(rows, workload, args.plot, title=f"{config.model} on {device}")
    return 0
