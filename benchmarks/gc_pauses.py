"""Python's garbage-collector pauses during a `nanocore` CLI command (GPU diagnostic, session 17).

Session 16's throughput timeline showed one 243-284 ms host stall per pass in a decode step; this records every
collection (generation, wall ms, objects collected, seconds since start) to find whether they are the stall.

    python3 -m benchmarks.gc_pauses OUT.json [--freeze] -- bench throughput --model dummy:Qwen3-0.6B ...

``--freeze``: ``gc.collect(); gc.freeze()`` once the engine is built (vLLM's answer: the startup heap is never
scanned again), to measure what that buys.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="JSON file for the pauses")
    p.add_argument("--freeze", action="store_true", help="freeze the heap after the engine is built")
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("give the nanocore CLI arguments after --")
    cut = argv.index("--")
    args, cli = p.parse_args(argv[:cut]), argv[cut + 1:]
    t0, pauses, started = time.perf_counter(), [], {}

    def on_gc(phase, info):
        now = time.perf_counter()
        if phase == "start":
            started["t"] = now
        elif "t" in started:
            pauses.append({"generation": info["generation"], "ms": 1e3 * (now - started.pop("t")),
                           "collected": info["collected"], "at_s": now - t0})

    gc.callbacks.append(on_gc)
    if args.freeze:
        from nanocore.engine.llm_engine import LLMEngine

        built = LLMEngine.__init__

        def init_then_freeze(self, *a, **k):
            built(self, *a, **k)
            gc.collect()
            gc.freeze()
            print(f"gc_pauses: froze {gc.get_freeze_count()} objects", file=sys.stderr)

        LLMEngine.__init__ = init_then_freeze
    from nanocore.cli.main import main as cli_main

    rc = 1
    try:
        rc = cli_main(cli)
    finally:  # a failed or interrupted command still reports the pauses it had
        write_report(args, cli, pauses, time.perf_counter() - t0)
    return rc


def write_report(args, cli: list[str], pauses: list[dict], end_s: float) -> None:
    """``end_s``: seconds from start to the command's return (a bench's timed pass is its last seconds)."""
    big = [x for x in pauses if x["generation"] == 2]
    with open(args.out, "w") as f:  # objects_tracked_at_end leaves out the frozen ones (see "frozen")
        json.dump({"argv": cli, "freeze": args.freeze, "objects_tracked_at_end": len(gc.get_objects()),
                   "frozen": gc.get_freeze_count(), "end_s": end_s, "gen2": big, "all_ms_by_generation":
                   {g: round(sum(x["ms"] for x in pauses if x["generation"] == g), 1) for g in (0, 1, 2)}}, f, indent=1)
    print("gc_pauses: gen2 collections (ms @ s):", [(round(x["ms"], 1), round(x["at_s"], 1)) for x in big],
          file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
