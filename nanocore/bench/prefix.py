"""``nanocore bench prefix``: token hit rate and wall time of the prefix cache on prompts sharing a prefix.

Every prompt is ``prefix_len + suffix_len`` random token ids, so each costs the same without a cache:
- ``no-reuse``: each request has its own random prefix; nothing can hit (the baseline).
- ``shared-prefix``: all requests share one prefix of ``prefix_len`` tokens (a system prompt).
- ``partial-shared``: request ``i`` of ``N`` shares the first ``(i + 1) / N`` of the common prefix and
  continues with its own tokens (1/8, 2/8 ... 8/8 for 8 requests, 9/16 of the prefix on average):
  matches that stop in the middle of a cached prefix.
Submission: one warm-up request (the common prefix + its own suffix; for ``no-reuse`` an unrelated
prompt of the same length) runs alone first, as a server's earlier traffic would; then the ``N``
requests are submitted together (as vLLM's prefix-caching benchmark does) and only they are timed.
Without the warm-up all ``N`` would be admitted in one step, before any prefix block is computed: no hits.
Hit rate = cached prompt tokens / prompt tokens of the timed requests (``RequestOutput.num_cached_tokens``:
full blocks served by the cache; the block holding a prompt's last token is always recomputed).
With ``--check-identical`` (default) a second engine with ``prefix_cache=none`` runs the same requests:
greedy outputs must be identical, and its times give the speedup over no cache at all. Where they are not
(random-weight models have nearly flat logits, so bf16 rounding differences between "prefix from the cache +
suffix chunk" and "whole prompt" can flip a greedy choice at a near-tie), that scenario is rerun (untimed) on
the no-cache engine with top-2 logprobs, and each differing request reports its first differing output
position and the no-cache run's top-1 minus top-2 logprob gap there. Verdict: "identical", "identical up to
near-ties (max gap X)" when every gap is under ``--near-tie-gap``, else "DIFFERENT (...)" (exit status 1).
The JSON's ``identical`` stays strict (token for token).
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

SCENARIOS = ("no-reuse", "shared-prefix", "partial-shared")
#: Default ``--near-tie-gap``: a first difference where the no-cache run's top-2 logprobs are closer than this
#: (nats) is attributed to rounding; bf16 logits of a random-weight model move by about 1e-2 between the paths.
NEAR_TIE_GAP = 0.05
COLUMNS = ["scenario", "prefix_cache", "requests", "prompt_tokens", "cached_tokens", "hit_rate", "seconds",
           "no_cache_seconds", "speedup_vs_no_cache", "identical"]


@dataclass(frozen=True)
class PrefixWorkload:
    num_requests: int = 8
    prefix_len: int = 1024
    suffix_len: int = 128
    output_len: int = 8
    repeats: int = 1  # fresh prompts each repeat; the median time is reported
    seed: int = 0

    def check(self) -> None:
        if self.num_requests < 1 or self.prefix_len < 1 or self.suffix_len < 1 or self.output_len < 1 \
                or self.repeats < 1:
            raise ValueError(f"--num-requests, --prefix-len, --suffix-len, --output-len and --repeats must be "
                             f">= 1, got {self}")


@dataclass
class ScenarioResult:
    scenario: str
    prefix_cache: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    seconds: float  # median over repeats of the timed batch
    warmup_seconds: float  # median over repeats of the warm-up request
    all_seconds: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)  # greedy token ids, every repeat's requests in order
    top2_gaps: list[list[float]] = field(default_factory=list)  # per output token, when run with logprobs


def make_prompts(scenario: str, workload: PrefixWorkload, vocab_size: int, repeat: int = 0,
                 tag: str = "") -> tuple[list[int], list[list[int]]]:
    """(warm-up prompt, timed prompts) of ``scenario``; deterministic for the workload's seed and ``repeat``."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    rng = random.Random(f"{tag}{scenario}:{workload.seed}:{repeat}")

    def rand(n: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(n)]

    p, n = workload.prefix_len, workload.num_requests
    common = rand(p)
    shared = {"no-reuse": lambda i: 0, "shared-prefix": lambda i: p,
              "partial-shared": lambda i: p * (i + 1) // n}[scenario]
    warmup = (rand(p) if scenario == "no-reuse" else common) + rand(workload.suffix_len)
    prompts = [common[:shared(i)] + rand(p - shared(i) + workload.suffix_len) for i in range(n)]
    return warmup, prompts


def top2_gap(position_logprobs: dict) -> float:
    """Top-1 minus top-2 logprob at one output position (``CompletionOutput.logprobs`` entry)."""
    values = sorted((lp.logprob for lp in position_logprobs.values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else float("inf")


def run_scenario(llm, scenario: str, workload: PrefixWorkload, vocab_size: int,
                 logprobs: int | None = None) -> ScenarioResult:
    """Warm-up request alone, then the timed batch submitted at once; ``repeats`` times with fresh prompts.
    ``logprobs=2`` also records each output token's top-2 gap (``top2_gaps``)."""
    from nanocore.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=workload.output_len, ignore_eos=True, logprobs=logprobs)
    seconds, warmup_seconds, outputs, gaps = [], [], [], []
    prompt_tokens = cached_tokens = 0
    for repeat in range(workload.repeats):
        warmup, prompts = make_prompts(scenario, workload, vocab_size, repeat)
        start = time.perf_counter()
        llm.generate([warmup], params, use_tqdm=False)
        warmup_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
        prompt_tokens += sum(len(p) for p in prompts)
        cached_tokens += sum(r.num_cached_tokens for r in results)
        outputs += [list(r.outputs[0].token_ids) for r in results]
        if logprobs:
            gaps += [[top2_gap(pos) for pos in r.outputs[0].logprobs] for r in results]
    return ScenarioResult(scenario, llm.engine.block_manager.prefix_cache.name or "?", workload.num_requests,
                          prompt_tokens, cached_tokens, cached_tokens / prompt_tokens, statistics.median(seconds),
                          statistics.median(warmup_seconds), seconds, outputs, gaps)


def warm_up_engine(llm, workload: PrefixWorkload, vocab_size: int) -> None:
    """First-call costs (allocator, kernel compilation, cached-context prefill) out of every measurement."""
    from nanocore.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    warmup, prompts = make_prompts("shared-prefix", workload, vocab_size, tag="engine-warm-up/")
    llm.generate([warmup], params, use_tqdm=False)
    llm.generate(prompts, params, use_tqdm=False)


def run_all(llm, scenarios: list[str], workload: PrefixWorkload, vocab_size: int) -> dict[str, ScenarioResult]:
    warm_up_engine(llm, workload, vocab_size)
    return {s: run_scenario(llm, s, workload, vocab_size) for s in scenarios}


def vocab_size_of(llm) -> int:
    hf_config = llm.engine.loaded.hf_config
    if hf_config is None or not getattr(hf_config, "vocab_size", None):
        raise ValueError("bench prefix needs a model whose config declares vocab_size (random prompt token ids)")
    return int(hf_config.vocab_size)


def differences(cached: list[list[int]], base: list[list[int]], base_gaps: list[list[float]]) -> list[dict]:
    """Per differing request: the first differing output position and the no-cache run's top-2 gap there."""
    out = []
    for i, (a, b) in enumerate(zip(cached, base)):
        if a == b:
            continue
        pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        gaps = base_gaps[i] if i < len(base_gaps) else []
        out.append({"request": i, "position": pos, "cached_token": a[pos] if pos < len(a) else None,
                    "no_cache_token": b[pos] if pos < len(b) else None,
                    "no_cache_top2_gap": gaps[pos] if pos < len(gaps) else None})
    return out


def verdict(diffs: list[dict], near_tie_gap: float) -> str:
    """"identical", "identical up to near-ties (max gap X)" or "DIFFERENT (gap X at ...)"."""
    if not diffs:
        return "identical"
    gaps = [d["no_cache_top2_gap"] for d in diffs]
    if all(g is not None and g < near_tie_gap for g in gaps):
        return f"identical up to near-ties (max gap {max(gaps):.3g})"
    worst = max(diffs, key=lambda d: float("inf") if d["no_cache_top2_gap"] is None else d["no_cache_top2_gap"])
    gap = "unknown" if worst["no_cache_top2_gap"] is None else f"{worst['no_cache_top2_gap']:.3g}"
    where = f"{worst['scenario']} " if "scenario" in worst else ""
    return f"DIFFERENT (gap {gap} at {where}request {worst['request']} position {worst['position']})"


def summary_rows(cached: dict[str, ScenarioResult], no_cache: dict[str, ScenarioResult] | None,
                 gaps: dict[str, list[list[float]]] | None = None, near_tie_gap: float = NEAR_TIE_GAP) -> list[dict]:
    """One table row per scenario, with the no-cache time and output identity when that engine ran;
    ``gaps``: the no-cache run's top-2 gaps per scenario (from ``explain_differences``)."""
    rows = []
    for name, r in cached.items():
        row = {k: v for k, v in asdict(r).items() if k not in ("outputs", "top2_gaps")}
        if no_cache is not None:
            base = no_cache[name]
            diffs = [{"scenario": name, **d} for d in
                     differences(r.outputs, base.outputs, (gaps or {}).get(name) or base.top2_gaps)]
            row.update(no_cache_seconds=base.seconds, speedup_vs_no_cache=base.seconds / r.seconds,
                       identical=base.outputs == r.outputs,
                       identical_requests=sum(a == b for a, b in zip(base.outputs, r.outputs)),
                       verdict=verdict(diffs, near_tie_gap), differences=diffs)
        rows.append(row)
    return rows


def explain_differences(llm, cached: dict[str, ScenarioResult], no_cache: dict[str, ScenarioResult],
                        workload: PrefixWorkload, vocab_size: int) -> dict[str, list[list[float]]]:
    """Rerun (untimed, with top-2 logprobs) each scenario whose outputs differ on the no-cache engine ``llm``.
    Returns the gaps per scenario; a rerun whose tokens differ from the timed no-cache run's is reported."""
    gaps = {}
    for name, r in cached.items():
        if r.outputs == no_cache[name].outputs:
            continue
        rerun = run_scenario(llm, name, workload, vocab_size, logprobs=2)
        if rerun.outputs != no_cache[name].outputs:
            print(f"{name}: the no-cache rerun with logprobs produced other tokens than the timed no-cache run; "
                  f"gaps below are the rerun's")
        gaps[name] = rerun.top2_gaps
    return gaps


def speedups(cached: dict[str, ScenarioResult]) -> dict[str, float]:
    """End-to-end speedup of each sharing scenario over ``no-reuse``, the issue's gate (>= 1.5x on GPU)."""
    if "no-reuse" not in cached:
        return {}
    base = cached["no-reuse"].seconds
    return {f"{name}_vs_no_reuse": base / r.seconds for name, r in cached.items() if name != "no-reuse"}


# ---- CLI -------------------------------------------------------------------------------------
def scenario_list(text: str) -> list[str]:
    names = list(SCENARIOS) if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not names:
        raise ValueError(f"unknown scenario(s) {unknown or text!r}; choose from {', '.join(SCENARIOS)} "
                         f"(comma-separated) or 'all'")
    return names


def add_arguments(p) -> None:
    p.add_argument("--scenario", default="all", help=f"{' | '.join(SCENARIOS)}, comma-separated, or 'all' (default)")
    p.add_argument("--num-requests", type=int, default=8, help="timed requests per scenario (default 8)")
    p.add_argument("--prefix-len", type=int, default=1024, help="shared prefix tokens (default 1024)")
    p.add_argument("--suffix-len", type=int, default=128, help="unique suffix tokens per request (default 128)")
    p.add_argument("--output-len", type=int, default=8, help="greedy output tokens per request (default 8)")
    p.add_argument("--repeats", type=int, default=1, help="timed batches per scenario, fresh prompts (median; default 1)")
    p.add_argument("--workload-seed", type=int, default=0, help="seed of the random prompts (default 0)")
    p.add_argument("--check-identical", action=argparse.BooleanOptionalAction, default=True,
                   help="rerun with prefix_cache=none: outputs must be identical up to near-ties (default on); "
                        "exit 1 if not")
    p.add_argument("--near-tie-gap", type=float, default=NEAR_TIE_GAP,
                   help=f"a first difference where the no-cache run's top-1 minus top-2 logprob is below this "
                        f"counts as a near-tie (default {NEAR_TIE_GAP})")


def run_from_args(args) -> int:
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.cli.common import engine_config_from_args
    from nanocore.engine.llm import LLM

    scenarios = scenario_list(args.scenario)
    workload = PrefixWorkload(args.num_requests, args.prefix_len, args.suffix_len, args.output_len, args.repeats,
                              args.workload_seed)
    workload.check()
    config = engine_config_from_args(args)
    llm = LLM(config=config)
    vocab, device = vocab_size_of(llm), str(llm.engine.device)
    cache_name = llm.engine.block_manager.prefix_cache.name
    cached = run_all(llm, scenarios, workload, vocab)
    no_cache = None
    if args.check_identical and cache_name != "none":
        del llm
        free_device_memory()  # the second engine profiles what the first one leaves
        llm = LLM(config=config.model_copy(update={"prefix_cache": "none", "prefix_cache_options": {}}))
        no_cache = run_all(llm, scenarios, workload, vocab)
    gaps = explain_differences(llm, cached, no_cache, workload, vocab) if no_cache else {}
    rows = summary_rows(cached, no_cache, gaps, args.near_tie_gap)
    print(format_table(rows, COLUMNS))
    gates = speedups(cached)
    for name, value in gates.items():
        print(f"{name}: {value:.2f}x")
    identical = all(r.get("identical", True) for r in rows)
    overall = verdict([d for r in rows for d in r.get("differences", [])], args.near_tie_gap) if no_cache else None
    print_differences(rows)
    write_json(args.json, {"command": "bench prefix", "workload": asdict(workload), "scenarios": scenarios,
                           "submission": "one warm-up request alone, then the timed requests together",
                           "rows": rows, "speedups": gates, "identical": identical if no_cache else None,
                           "near_tie_gap": args.near_tie_gap, "verdict": overall,
                           "config": config_summary(config), "environment": environment(device)})
    if overall is not None:
        print(f"verdict: {overall}")
    if overall is not None and overall.startswith("DIFFERENT"):
        print("greedy outputs differ with and without the prefix cache beyond near-ties (see 'differences')")
        return 1
    return 0


def print_differences(rows: list[dict]) -> None:
    for r in rows:
        if "verdict" in r:
            print(f"{r['scenario']}: outputs with vs without the cache: {r['verdict']}")
            for d in r["differences"]:
                print(f"  request {d['request']}: first difference at output position {d['position']} "
                      f"({d['cached_token']} vs {d['no_cache_token']}), no-cache top-2 gap {d['no_cache_top2_gap']}")


def free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
