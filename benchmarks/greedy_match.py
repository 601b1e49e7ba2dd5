"""Greedy output of a real model on one device against a reference run on another, up to the first near-tie.

The reference (``--write-reference``, normally on CPU in float32) stores, for the built-in prompts, each greedy
token and the gap between the two most likely tokens at every position. A check run (``--reference FILE``, e.g.
on the GPU) generates the same continuations and reports, per prompt, the first position where its token differs
and the reference's top-2 gap there: a flip where the reference itself was nearly tied is rounding, a flip with a
large gap is a bug. Usage (the SmolLM2 check):

    python -m benchmarks.greedy_match --device cpu --dtype float32 \
        --write-reference docs/data/correctness/greedy_smollm2_cpu.json
    python -m benchmarks.greedy_match --device cuda --dtype float32 \
        --reference docs/data/correctness/greedy_smollm2_cpu.json --json OUT.json  # exit 1: a flip that is no near-tie
    python -m benchmarks.greedy_match --reference CPU_BF16.json --run-file GPU_BF16.json   # two stored runs

A near-tie depends on the dtype: float32 logits flip below 0.05 nats; bf16 logits are rounded to 1/8 at the
magnitudes of SmolLM2's top logits (16..32), and SmolLM2 in bf16 on the CPU already flips against its own float32
run at gaps up to 0.20 (docs/data/correctness/greedy_smollm2_cpu_bfloat16.json), so half-precision comparisons use
0.25.
"""
from __future__ import annotations

import argparse
import json
import sys

from nanocore.bench.prefix import NEAR_TIE_GAP as NEAR_TIE  # nats between the top-2 tokens: below, a flip is rounding
from nanocore.bench.prefix import top2_gap
from nanocore.eval.compare import PROMPTS


def run_greedy(model: str, device: str, dtype: str, max_tokens: int,
               enforce_eager: bool = False) -> tuple[list[dict], str]:
    """Per prompt: greedy token ids and the top-1 minus top-2 logprob gap at each position; the dtype it ran in."""
    from nanocore import LLM, SamplingParams

    llm = LLM(model, device=device, dtype=dtype, enforce_eager=enforce_eager, max_num_seqs=len(PROMPTS),
              num_kv_blocks=512)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    rows = []
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False)):
        completion = out.outputs[0]
        gaps = [top2_gap(entry) for entry in completion.logprobs]
        gaps = [None if gap == float("inf") else gap for gap in gaps]  # one candidate only; JSON has no inf
        rows.append({"prompt": prompt, "token_ids": list(completion.token_ids), "top2_gaps": gaps})
    return rows, str(llm.engine.loaded.dtype).removeprefix("torch.")  # "auto" resolved


#: Near-tie gap (nats) for runs in half precision: two bf16 roundings of logits in 16..32 (see the docstring).
HALF_PRECISION_NEAR_TIE = 0.25


def near_tie_for(*dtypes: str) -> float:
    """The near-tie gap for comparing runs in these dtypes: the coarsest one decides."""
    return max(NEAR_TIE if dtype == "float32" else HALF_PRECISION_NEAR_TIE for dtype in dtypes)


def compare(reference: list[dict], got: list[dict], near_tie: float = NEAR_TIE) -> dict:
    """Per prompt the first differing position and the reference's gap there; an overall verdict."""
    prompts, worst = [], None
    for ref, mine in zip(reference, got):
        pos = next((i for i, (a, b) in enumerate(zip(ref["token_ids"], mine["token_ids"])) if a != b), None)
        row = {"prompt": ref["prompt"], "first_difference": pos}
        if pos is not None:
            gap = ref["top2_gaps"][pos]
            row["reference_gap"] = float("inf") if gap is None else gap
            worst = row["reference_gap"] if worst is None else max(worst, row["reference_gap"])
        prompts.append(row)
    if worst is None:
        verdict = "identical"
    elif worst < near_tie:
        verdict = f"identical up to near-ties (largest reference gap at a flip {worst:.4f} < {near_tie})"
    else:
        verdict = f"DIFFERENT (a flip where the reference's top-2 gap was {worst:.4f} >= {near_tie})"
    return {"verdict": verdict, "ok": worst is None or worst < near_tie, "prompts": prompts}


def main(argv: list[str] | None = None) -> int:
    from nanocore.bench.report import environment, write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="checkpoint folder or 'default' (SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--near-tie", type=float, help="gap in nats below which a flip is rounding (default: "
                   f"{NEAR_TIE} for float32 runs, {HALF_PRECISION_NEAR_TIE} when either run is half precision)")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-reference", metavar="PATH", help="write this run as the reference")
    group.add_argument("--reference", metavar="PATH", help="compare this run with a reference file")
    p.add_argument("--run-file", metavar="PATH", help="with --reference: compare this stored run (a --json or "
                   "--write-reference file) instead of running the model")
    p.add_argument("--json", metavar="PATH", help="with --reference: write the comparison")
    args = p.parse_args(argv)
    if args.run_file and not args.reference:
        p.error("--run-file needs --reference")
    if args.run_file:
        with open(args.run_file) as f:
            run = {k: v for k, v in json.load(f).items() if k in ("model", "device", "dtype", "max_tokens", "rows",
                                                                     "environment")}
    else:
        rows, dtype = run_greedy(args.model, args.device, args.dtype, args.max_tokens, args.enforce_eager)
        run = {"model": args.model, "device": args.device, "dtype": dtype, "max_tokens": args.max_tokens,
               "rows": rows, "environment": environment(args.device)}
    if args.write_reference:
        write_json(args.write_reference, run)
        return 0
    with open(args.reference) as f:
        reference = json.load(f)
    if reference["model"] != run["model"]:
        raise SystemExit(f"{args.reference} is a run of {reference['model']!r}, this run is of {run['model']!r}")
    if len(reference["rows"]) != len(run["rows"]) or reference["max_tokens"] != run["max_tokens"]:
        raise SystemExit(f"{args.reference} holds {len(reference['rows'])} prompts x {reference['max_tokens']} tokens; "
                         f"this run has {len(run['rows'])} x {run['max_tokens']}: write a new reference")
    near_tie = args.near_tie if args.near_tie is not None else near_tie_for(reference["dtype"], run["dtype"])
    result = compare(reference["rows"], run["rows"], near_tie)
    for row in result["prompts"]:
        where = "identical" if row["first_difference"] is None else \
            f"first difference at token {row['first_difference']} (reference gap {row['reference_gap']:.4f})"
        print(f"{row['prompt'][:40]!r:44} {where}")
    print(result["verdict"])
    write_json(args.json, {**run, "reference": args.reference, "reference_environment": reference.get("environment"),
                           "near_tie": near_tie, **result})
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
