"""CPU tokens/s of the default model (SmolLM2-135M-Instruct), so later changes can be compared.

    python -m benchmarks.smollm2_cpu [--threads 1] [--json bench_smollm2_cpu.json]

Two rows: one sequence decoding (batch 1) and the throughput workload (16 sequences, lengths 16..64).
Not a timed test: numbers depend on the machine and its load (on a busy 2-core box use --threads 1).
"""
from __future__ import annotations

import argparse
import time

from nanocore.bench.report import config_summary, environment, format_table, write_json
from nanocore.bench.throughput import result_dict, run_throughput

COLUMNS = ["case", "num_seqs", "prompt_tokens", "output_tokens", "seconds", "output_tokens_per_s", "total_tokens_per_s"]


def batch1_decode(llm, prompt_len: int = 32, output_len: int = 64) -> dict:
    from nanocore.engine.sampling_params import SamplingParams

    prompt = list(range(1000, 1000 + prompt_len))
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    start = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"case": "batch1_decode", "num_seqs": 1, "prompt_tokens": prompt_len, "output_tokens": output_len,
            "seconds": seconds, "output_tokens_per_s": output_len / seconds,
            "total_tokens_per_s": (prompt_len + output_len) / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--num-seqs", type=int, default=16)
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON")
    args = parser.parse_args(argv)
    import torch

    from nanocore.engine.llm import LLM

    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM("default", device="cpu", dtype="float32", num_kv_blocks=512)
    rows = [batch1_decode(llm)]
    result = run_throughput(llm, args.num_seqs, 16, 64, warmup="one")  # as its recorded figures were measured
    rows.append({"case": "throughput", **result_dict(result)})
    print(format_table(rows, COLUMNS))
    write_json(args.json, {"command": "bench smollm2_cpu", "rows": rows, "config": config_summary(llm.config),
                           "environment": environment("cpu")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
