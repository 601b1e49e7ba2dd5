"""Where a long prefill's time goes, per KV codec: the kernels with the most device time (GPU only, a diagnostic).

``python3 -m benchmarks.prefill_kernel_table OUT.json [--codecs unquantized k_int8_v_fp8] [--num-seqs 8
--prompt-len 4096]``: per codec, an eager LLM on dummy Qwen3-0.6B (bf16) runs one untimed prefill, then the
same batch of random prompts (one output token each) timed and once more under torch.profiler; prints the top
kernels and each codec's total against the first codec's, so the gap of ``bench prefill`` is attributed to kernels
(issue 17: 8 x 4,096 with ``k_int8_v_fp8`` took 1.104x the bf16 time).
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time

import torch


def profile_prefill(codec: str, num_seqs: int, prompt_len: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from nanocore import LLM, EngineConfig, SamplingParams
    config = EngineConfig(model="dummy:Qwen3-0.6B", device="cuda", dtype="bfloat16", kv_codec=codec,
                          enforce_eager=True, max_model_len=prompt_len + 512, max_num_seqs=num_seqs)
    llm = LLM(config=config)
    rng = random.Random(0)
    vocab = llm.engine.loaded.hf_config.vocab_size
    batch = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(num_seqs)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(batch, params, use_tqdm=False)  # compiles and first-call work
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([[(t + 1) % vocab for t in p] for p in batch], params, use_tqdm=False)  # new ids: no prefix reuse
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate([[(t + 2) % vocab for t in p] for p in batch], params, use_tqdm=False)
        torch.cuda.synchronize()

    def spent(event) -> float:
        return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
    events = sorted(prof.key_averages(), key=spent, reverse=True)
    kernels = [{"kernel": e.key[:80], "ms": spent(e) / 1e3, "calls": e.count} for e in events if spent(e) > 0]
    llm.close()  # the next codec's engine sizes its KV cache from the memory this one frees
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {"codec": codec, "seconds": seconds, "device_ms": sum(k["ms"] for k in kernels), "top": kernels[:top]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("--codecs", nargs="+", default=["unquantized", "k_int8_v_fp8"])
    p.add_argument("--num-seqs", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=4096)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    rows = [profile_prefill(c, args.num_seqs, args.prompt_len, args.top) for c in args.codecs]
    for r in rows:
        print(f"{r['codec']}: {r['seconds'] * 1e3:.1f} ms wall ({r['seconds'] / rows[0]['seconds']:.3f}x), "
              f"{r['device_ms']:.1f} ms of kernels")
        for k in r["top"]:
            print(f"  {k['ms']:8.2f} ms {k['calls']:5d} calls  {k['kernel']}")
    import triton
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "num_seqs": args.num_seqs, "prompt_len": args.prompt_len, "rows": rows}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
