"""One tensor-parallel engine on a tiny random checkpoint, every stage timed: the first thing to run on a new
multi-GPU machine (a hang names its stage; ``kill -USR1`` on any rank dumps its stack).

    NANOCORE_TRACE_WORKERS=1 NANOCORE_DIST_TIMEOUT_S=60 python -m benchmarks.tp_smoke --gpus 2 [--eager] [--moe]
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.tp_check import NVLS_OFF, PROMPTS, make_checkpoints


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--moe", action="store_true", help="the MoE checkpoint at TP=N+EP=N")
    args = p.parse_args(argv)
    os.environ.update(NVLS_OFF)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams

    start = time.monotonic()

    def stage(what: str) -> None:
        print(f"[tp_smoke {time.monotonic() - start:7.2f} s] {what}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path = make_checkpoints(Path(tmp), moe=args.moe)["moe" if args.moe else "dense"]
        stage("checkpoint written")
        llm = LLM(str(path), device=args.device, dtype="bfloat16", tensor_parallel_size=args.gpus,
                  expert_parallel_size=args.gpus if args.moe else 1, gpu_memory_utilization=0.3,
                  max_num_seqs=8, enforce_eager=args.eager)
        stage(f"engine built ({llm.engine.runner.num_blocks} KV blocks)")
        llm.engine.prompt_logits(PROMPTS[0])
        stage("prompt_logits")
        out = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
        stage(f"generate: {[len(o.outputs[0].token_ids) for o in out]} tokens")
        llm.close()
        stage("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
