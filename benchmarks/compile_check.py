"""GPU check: once the engine reports ready, no Triton kernel compiles while it serves.

Starts an LLM (kernel warm-up on), then runs varied work through it: prompt lengths 1..2000 alone and in
batches, decode batches of many sizes, prompts sharing a cached prefix, requests arriving while others decode
(mixed steps, chunked prefill), greedy / temperature / top-k / logprobs sampling. Every Triton compilation
after start-up is printed (kernel and specialisation); exits 1 if there was any. Prints the warm-up time.

    python3 benchmarks/compile_check.py [--model dummy:Qwen3-0.6B] [--json OUT.json] [--no-warmup]

About 1-2 minutes on an H200 (most of it compiling at start when Triton's disk cache is cold).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter

#: Prompt lengths run alone: every class boundary of the attention tiles / GEMM configs and its neighbours.
LENGTHS = [1, 2, 3, 5, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 255, 257, 511, 513, 1000, 1023, 1025,
           1500, 1999, 2000]
DECODE_BATCHES = [1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 29, 33, 64, 100, 127, 200, 256]


class CompileRecorder:
    """Records every Triton JIT compilation (in-process cache miss) from ``install()`` on; ``late`` after ``arm()``."""

    def __init__(self):
        self.early: list[str] = []
        self.late: list[str] = []
        self.armed = False
        self.mechanism = ""
        self.uninstall = lambda: None

    def _record(self, name: str, spec: str) -> None:
        (self.late if self.armed else self.early).append(f"{name}: {spec}")

    def install(self) -> CompileRecorder:
        import triton
        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        if runtime is not None and hasattr(runtime, "jit_post_compile_hook"):  # triton >= 3.4
            previous = runtime.jit_post_compile_hook

            def hook(*args, **kwargs):
                fn = kwargs.get("fn")
                self._record(f"{fn.module}.{fn.name}" if fn is not None else "?", kwargs.get("repr", ""))
                return previous(*args, **kwargs) if previous is not None else None
            runtime.jit_post_compile_hook = hook
            self.mechanism = "triton.knobs.runtime.jit_post_compile_hook"
            self.uninstall = lambda: setattr(runtime, "jit_post_compile_hook", previous)
            return self
        from triton.runtime.jit import JITFunction  # older Triton: wrap the compile step itself
        original = JITFunction._do_compile

        def _do_compile(jit, key, signature, device, constexprs, *args, **kwargs):
            self._record(f"{jit.fn.__module__}.{jit.fn.__qualname__}", f"{signature} {constexprs}")
            return original(jit, key, signature, device, constexprs, *args, **kwargs)
        JITFunction._do_compile = _do_compile
        self.mechanism = "JITFunction._do_compile"
        self.uninstall = lambda: setattr(JITFunction, "_do_compile", original)
        return self

    def arm(self) -> None:
        self.armed = True


def workload(llm, rng: random.Random, max_len: int = 2000, decode_batches=DECODE_BATCHES,
             vocab: int = 5000) -> dict[str, float]:
    """The serving-like calls (prompts of random token ids below ``vocab``); returns seconds per part."""
    from nanocore import SamplingParams

    def _prompt(rng, n):
        return [rng.randrange(10, vocab) for _ in range(n)]
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    hot = SamplingParams(temperature=0.8, max_tokens=4, ignore_eos=True)
    fancy = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=3, ignore_eos=True, logprobs=2)
    times, limit = {}, llm.config.max_num_seqs

    def part(name, fn):
        start = time.perf_counter()
        fn()
        times[name] = round(time.perf_counter() - start, 2)

    part("lengths_alone", lambda: [llm.generate([_prompt(rng, n)], greedy, use_tqdm=False)
                                   for n in LENGTHS if n <= max_len])
    part("mixed_batches", lambda: [llm.generate([_prompt(rng, rng.randint(1, max_len)) for _ in range(bs)],
                                                [greedy, hot, fancy][i % 3], use_tqdm=False)
                                   for i, bs in enumerate((2, 5, 16, 33))])
    decode = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    part("decode_batches", lambda: [llm.generate([_prompt(rng, rng.randint(1, 40)) for _ in range(bs)], decode,
                                                 use_tqdm=False) for bs in decode_batches if bs <= limit])

    def cached_prefixes():
        cap = max_len // 4  # prefix + suffix stay within max_len
        for prefix_len in (16, max_len // 4, 3 * max_len // 4):
            prefix = _prompt(rng, prefix_len)
            llm.generate([prefix + _prompt(rng, 3)], greedy, use_tqdm=False)  # fills the prefix cache
            llm.generate([prefix + _prompt(rng, min(n, cap)) for n in (1, 2, 7, 40, 300)], greedy, use_tqdm=False)
            for n in (1, 9, 100):
                llm.generate([prefix + _prompt(rng, min(n, cap))], hot, use_tqdm=False)
    part("cached_prefixes", cached_prefixes)

    def arrivals():  # requests join while others decode: mixed steps, chunks of long prompts
        engine, long = llm.engine, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        for i in range(min(48, limit)):
            engine.add_request(_prompt(rng, min(max_len, rng.choice((1, 3, 17, 90, 700, max_len)))), long)
            for _ in range(rng.randint(0, 3)):
                engine.step()
        while engine.has_unfinished_requests():
            engine.step()
    part("arrivals", arrivals)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dummy:Qwen3-0.6B")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--no-warmup", action="store_true", help="kernel_warmup=False: shows what it prevents")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    recorder = CompileRecorder().install()
    import nanocore.runner.warmup as warmup
    from nanocore import LLM
    timed = {}
    run_warmup = warmup.run_warmup

    def timed_warmup(*a, **kw):  # the runner imports it at start-up: time the call itself
        start = time.perf_counter()
        plan = run_warmup(*a, **kw)
        timed["warmup_s"], timed["warmup_batches"] = round(time.perf_counter() - start, 2), len(plan)
        return plan
    warmup.run_warmup = timed_warmup
    start = time.perf_counter()
    llm = LLM(args.model, device="cuda", dtype=args.dtype, max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              kernel_warmup=not args.no_warmup)
    ready_s = time.perf_counter() - start
    recorder.arm()
    parts = workload(llm, random.Random(0))
    result = {"model": args.model, "hook": recorder.mechanism, "ready_s": round(ready_s, 2), **timed,
              "compiles_at_start": len(recorder.early), "late_compiles": recorder.late, "workload_s": parts,
              "prefix_cache": llm.config.prefix_cache, "config": llm.config.model_dump(mode="json")}
    print(f"ready in {ready_s:.1f} s (kernel warm-up {timed.get('warmup_s', 'off')} s, "
          f"{timed.get('warmup_batches', 0)} batches; {len(recorder.early)} compiles at start, "
          f"via {recorder.mechanism})")
    per_kernel = Counter(line.split(":", 1)[0] for line in recorder.early)
    print("compiled at start:", ", ".join(f"{name.rsplit('.', 1)[-1]} x{n}" for name, n in per_kernel.most_common()))
    print("workload seconds:", json.dumps(parts))
    for line in recorder.late:
        print("LATE COMPILE", line)
    print(f"{len(recorder.late)} kernel compilations after the engine was ready")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    llm.close()
    return 1 if recorder.late else 0


if __name__ == "__main__":
    sys.exit(main())
