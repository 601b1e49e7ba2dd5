"""Run under torchrun by tests/test_torchrun.py: an LLM on the launcher's ranks; rank 0 writes the greedy tokens.

Usage: torchrun ... tests/torchrun_generate.py CKPT OUT_JSON TP EP [--hold SECONDS [--idle]]
(``PIPELINE_STAGES`` in the environment: pipeline_parallel_size, default 1)
Ranks > 0 never return from ``LLM(...)``: they serve rank 0 and exit when it closes. ``--hold`` keeps rank 0
stepping (``--idle``: sleeping) after generating, so a test can kill a rank meanwhile.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

PROMPTS = [[5, 17, 200, 3, 99, 42, 7, 150, 249], [8, 1, 77], list(range(30, 60))]


def main() -> None:
    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams

    ckpt, out, tp, ep = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    hold_s = float(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--hold" else 0.0
    idle = sys.argv[-1] == "--idle"
    torch.set_num_threads(1)
    llm = LLM(ckpt, device="cpu", block_size=4, num_kv_blocks=96, tensor_parallel_size=tp,
              expert_parallel_size=ep, heartbeat_timeout_s=float(os.environ.get("HEARTBEAT_S", "10")),
              pipeline_parallel_size=int(os.environ.get("PIPELINE_STAGES", "1")))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    with open(out, "w") as f:
        json.dump({"tokens": tokens, "pid": os.getpid()}, f)
    if hold_s:
        print("holding", flush=True)
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:  # steps keep the ranks talking while the test kills one
            if idle:
                time.sleep(0.2)
                continue
            llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
            time.sleep(0.2)
    llm.close()
    try:  # the other ranks ended with the first engine: a second one is refused, never left waiting for them
        LLM(ckpt, device="cpu", tensor_parallel_size=tp, expert_parallel_size=ep,
            pipeline_parallel_size=int(os.environ.get("PIPELINE_STAGES", "1")))
    except ValueError as exc:
        with open(out, "w") as f:
            json.dump({"tokens": tokens, "pid": os.getpid(), "second_engine": str(exc)}, f)


if __name__ == "__main__":
    main()
