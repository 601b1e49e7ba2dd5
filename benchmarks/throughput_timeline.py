"""Where a ``bench throughput`` pass spends its time, step by step (GPU diagnostics, not installed).

    python3 -m benchmarks.throughput_timeline --kv-codec k_int8_v_fp8 --json OUT.json

Runs the Nano-vLLM workload as ``nanocore bench throughput`` does (same engine defaults, the full warm-up pass
first), and during the timed pass notes for every step its wall time (between consecutive ``step`` returns, async
scheduling as in the bench, so a decode step's time includes queueing the next step's look-ahead; the first step's
also holds ``generate`` adding the requests), its rows, tokens and longest context, and every Triton compilation.
Steps are summed per kind: prefill (any row with 2+ tokens) and decode by batch-size bin, so two codecs' runs show
which steps differ.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

BINS = (16, 64, 128, 192, 256, 512)  # decode steps by rows: <= 16, 17..64, ...


def kind_of(rows: int, max_tokens: int) -> str:
    if max_tokens > 1:
        return "prefill"
    if rows > BINS[-1]:
        return f"decode {BINS[-1] + 1}+"
    upper = next(b for b in BINS if rows <= b)
    lower = max((b for b in BINS if b < upper), default=0) + 1
    return f"decode {lower}-{upper}"


def summarize(steps: list[dict]) -> dict:
    """Seconds, steps, rows and tokens per kind, plus the pass total."""
    out: dict[str, dict] = {}
    for s in steps:
        k = out.setdefault(kind_of(s["rows"], s["max_tokens"]), {"steps": 0, "seconds": 0.0, "tokens": 0,
                                                                 "rows": 0, "max_context": 0})
        k["steps"] += 1
        k["seconds"] += s["seconds"]
        k["tokens"] += s["tokens"]
        k["rows"] += s["rows"]
        k["max_context"] = max(k["max_context"], s["max_context"])
    for k in out.values():
        k["ms_per_step"] = 1e3 * k["seconds"] / k["steps"]
        k["mean_rows"] = k["rows"] / k["steps"]
    return dict(sorted(out.items()))


class StepRecorder:
    """Wraps ``engine.scheduler.schedule`` (the batch's shape) and ``engine.step`` (its end time) while armed."""

    def __init__(self, engine):
        self.engine, self.steps, self.armed = engine, [], False
        schedule, step = engine.scheduler.schedule, engine.step
        self._last = None

        def noted_schedule():
            plan = schedule()
            if self.armed:
                self.steps.append({"rows": len(plan.rows), "tokens": plan.num_tokens,
                                   "max_tokens": max((len(r.token_ids) for r in plan.rows), default=0),
                                   "max_context": max((r.start + len(r.token_ids) for r in plan.rows), default=0)})
            return plan

        def timed_step():
            out = step()
            now = time.perf_counter()
            if self.armed and self.steps and "seconds" not in self.steps[-1]:
                self.steps[-1]["seconds"] = now - self._last
            self._last = now
            return out
        engine.scheduler.schedule, engine.step = noted_schedule, timed_step

    def arm(self) -> None:
        self.armed, self._last = True, time.perf_counter()


def main(argv=None) -> int:
    from benchmarks.compile_check import CompileRecorder
    from nanocore.bench.report import environment, format_table, write_json
    from nanocore.bench.throughput import WORKLOADS, shifted_prompts, workload_requests
    from nanocore.engine.llm import LLM

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="dummy:Qwen3-0.6B")
    p.add_argument("--kv-codec", default="unquantized")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-seqs", type=int, default=WORKLOADS["nano-vllm"].num_seqs)
    p.add_argument("--max-len", type=int, default=WORKLOADS["nano-vllm"].prompt_lens[1],
                   help="longest prompt and output (the CPU test shrinks the workload)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    llm = LLM(args.model, device=args.device, dtype="bfloat16", max_model_len=args.max_model_len,
              kv_codec=args.kv_codec)
    vocab = llm.engine.loaded.hf_config.vocab_size
    min_len = min(WORKLOADS["nano-vllm"].prompt_lens[0], args.max_len)
    prompts, params = workload_requests(vocab, args.num_seqs, min_len, args.max_len)
    llm.generate(shifted_prompts(prompts, vocab), params, use_tqdm=False)  # the bench's full warm-up
    compiles, recorder = CompileRecorder().install(), StepRecorder(llm.engine)
    try:  # the Triton hook is process-wide: never leave it installed
        compiles.arm()
        recorder.arm()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        compiles.uninstall()
    steps = [s for s in recorder.steps if "seconds" in s]
    kinds = summarize(steps)
    print(f"{args.kv_codec}: {seconds:.3f} s, {len(steps)} steps (sum {sum(s['seconds'] for s in steps):.3f} s), "
          f"{len(compiles.late)} Triton compiles in the timed pass")
    print(format_table([{"kind": k, **v} for k, v in kinds.items()]))
    for c in compiles.late[:20]:
        print("compiled:", c[:300])
    write_json(args.json, {"command": "throughput_timeline", "kv_codec": args.kv_codec, "seconds": seconds,
                           "prompt_tokens": sum(map(len, prompts)),
                           "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                           "kinds": kinds, "late_compiles": compiles.late, "steps": steps,
                           "environment": environment(args.device)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
