"""``nanocore bench MODE``: performance measurements that print a table and write JSON (``--json``).

Modes live in ``MODES`` (name -> (help, add_arguments, run)); the GPU modes (latency, prefill) plug in here.
"""
from __future__ import annotations

from nanocore.bench import interference as interference_bench
from nanocore.bench import prefix as prefix_bench
from nanocore.bench import serve as serve_bench
from nanocore.bench.throughput import WARMUPS, WORKLOADS
from nanocore.cli.common import add_engine_args, engine_config_from_args

THROUGHPUT_COLUMNS = ["model", "num_seqs", "prompt_tokens", "output_tokens", "seconds", "output_tokens_per_s",
                      "total_tokens_per_s", "preemptions", "peak_running_seqs", "peak_kv_usage", "kv_capacity_tokens"]


def add_throughput_args(p) -> None:
    p.add_argument("--workload", choices=list(WORKLOADS), default="nano-vllm",
                   help="'nano-vllm' (default): 256 sequences, prompts and outputs 100..1024 tokens; 'kv-bound': 512 "
                        "sequences, prompts 1024..2048, outputs 512..1024, max_num_seqs 512 and max_model_len 4096 "
                        "unless given (more KV than a bf16 cache holds at Llama-3.1-8B shapes on an H200: run it "
                        "with --model dummy:Llama-3.1-8B); the flags below override its numbers")
    p.add_argument("--num-seqs", type=int, help="sequences in the batch (default: the workload's)")
    p.add_argument("--min-len", type=int, help="shortest prompt (default: the workload's)")
    p.add_argument("--max-len", type=int, help="longest prompt (default: the workload's)")
    p.add_argument("--min-output-len", type=int, help="shortest output (default: the workload's; nano-vllm: --min-len)")
    p.add_argument("--max-output-len", type=int, help="longest output (default: the workload's; nano-vllm: --max-len)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--workload-seed", type=int, default=0, help="seed of the random workload (default 0)")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.add_argument("--warmup", choices=WARMUPS, default="full",
                   help="untimed pass first: 'full' = the same workload with other token ids (default; compiles "
                        "every kernel variant the timed pass needs), 'one' = one short request, 'none'")


def throughput_workload(args) -> tuple[dict, dict]:
    """(batch: num_seqs, min_len, max_len, output_lens; engine fields the preset sets and no flag gives)."""
    preset = WORKLOADS[args.workload]
    min_len = args.min_len if args.min_len is not None else preset.prompt_lens[0]
    max_len = args.max_len if args.max_len is not None else preset.prompt_lens[1]
    min_out, max_out = preset.output_lens or (min_len, max_len)
    output_lens = (args.min_output_len if args.min_output_len is not None else min_out,
                   args.max_output_len if args.max_output_len is not None else max_out)
    batch = {"num_seqs": args.num_seqs if args.num_seqs is not None else preset.num_seqs,
             "min_len": min_len, "max_len": max_len, "output_lens": output_lens}
    engine = {k: v for k, v in preset.engine.items() if getattr(args, k, None) is None}
    return batch, engine


def run_throughput_cmd(args) -> int:
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.bench.memory_floor import floor_report
    from nanocore.bench.throughput import make_workload, result_dict, run_throughput
    from nanocore.engine.llm import LLM

    batch, engine_fields = throughput_workload(args)
    config = engine_config_from_args(args)
    preset = {k: v for k, v in engine_fields.items() if k not in config.model_fields_set}  # file / env win too
    if preset:
        config = engine_config_from_args(args, **preset)
    llm = LLM(config=config)
    result = run_throughput(llm, batch["num_seqs"], batch["min_len"], batch["max_len"], args.temperature,
                            args.workload_seed, warmup=args.warmup, use_tqdm=args.progress,
                            output_lens=batch["output_lens"])
    workload = make_workload(batch["num_seqs"], batch["min_len"], batch["max_len"],
                             llm.engine.loaded.hf_config.vocab_size, args.workload_seed, batch["output_lens"])
    floor = floor_report(llm, [len(p) for p, _ in workload], [n for _, n in workload], result.steps, result.seconds)
    row = {"model": config.model, **result_dict(result), "fraction_of_floor": floor["fraction_of_floor"]}
    print(format_table([row], THROUGHPUT_COLUMNS + ["fraction_of_floor"]))
    write_json(args.json, {"command": "bench throughput", "workload": {
        "name": args.workload, "num_seqs": batch["num_seqs"], "min_len": batch["min_len"], "max_len": batch["max_len"],
        "min_output_len": batch["output_lens"][0], "max_output_len": batch["output_lens"][1],
        "temperature": args.temperature, "seed": args.workload_seed, "ignore_eos": True},
        "result": result_dict(result), "memory_floor": floor, "config": config_summary(config),
        "kv_capacity_tokens": llm.engine.runner.capacity_tokens,
        "environment": environment(str(llm.engine.device))})
    return 0


def add_latency_args(p) -> None:
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens (default 128)")
    p.add_argument("--repeats", type=int, default=3, help="timed requests; the median is reported (default 3)")


def run_latency_cmd(args) -> int:
    from nanocore.bench.latency import run_latency
    return _run_single(args, "bench latency", lambda llm: run_latency(llm, args.prompt_len, args.output_len,
                                                                       args.repeats),
                       ["model", "prompt_len", "output_len", "ttft_ms", "tpot_ms", "decode_tokens_per_s"])


def add_prefill_args(p) -> None:
    p.add_argument("--num-seqs", type=int, default=8, help="prompts in the batch (default 8)")
    p.add_argument("--prompt-len", type=int, default=4096, help="tokens per prompt (default 4096)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense peak for MFU (default: 790 on CUDA, the measured H200 bf16 figure; none on CPU)")


def run_prefill_cmd(args) -> int:
    from nanocore.bench.prefill import run_prefill

    def measure(llm):
        peak = args.peak_tflops or (790.0 if llm.engine.device.type == "cuda" else None)
        return run_prefill(llm, args.num_seqs, args.prompt_len, peak)
    return _run_single(args, "bench prefill", measure,
                       ["model", "num_seqs", "prompt_len", "seconds", "prefill_tokens_per_s", "tflops_per_s", "mfu"])


def _run_single(args, command: str, measure, columns: list[str]) -> int:
    """Build the engine from the flags, measure one row, print it and write JSON with provenance."""
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.engine.llm import LLM

    config = engine_config_from_args(args)
    llm = LLM(config=config)
    row = {"model": config.model, **measure(llm)}
    print(format_table([row], columns))
    write_json(args.json, {"command": command, "result": row, "config": config_summary(config),
                           "kv_capacity_tokens": llm.engine.runner.capacity_tokens,
                           "environment": environment(str(llm.engine.device))})
    return 0


def run_serve_cmd(args) -> int:
    return serve_bench.run_from_args(args, None if args.url else engine_config_from_args(args))


#: mode -> (help, add_arguments(parser), run(args) -> exit code)
MODES = {
    "throughput": ("offline batch throughput (random prompts, ignore EOS)", add_throughput_args, run_throughput_cmd),
    "prefix": ("prefix-cache token hit rate and wall time on shared prompt prefixes", prefix_bench.add_arguments,
               prefix_bench.run_from_args),
    "latency": ("batch-1 TTFT and TPOT (greedy, ignore EOS)", add_latency_args, run_latency_cmd),
    "prefill": ("prefill tokens/s and MFU for a batch of long prompts", add_prefill_args, run_prefill_cmd),
    "interference": ("a long prompt arriving during a decode: decode inter-token latency and its TTFT per "
                     "scheduling mode", interference_bench.add_arguments, interference_bench.run_interference_cmd),
    "serve": ("served throughput and TTFT / TPOT / ITL through the OpenAI API (fixed concurrency or Poisson "
              "request rates), against --url or a server it starts", serve_bench.add_arguments, run_serve_cmd),
}


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="performance benchmarks (print a table, --json writes JSON)")
    sub = p.add_subparsers(dest="bench_mode", metavar="MODE")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    for name, (help_text, add_arguments, run) in MODES.items():
        mode = sub.add_parser(name, help=help_text)
        add_arguments(mode)
        mode.add_argument("--json", metavar="PATH", help="write the result as JSON")
        add_engine_args(mode)
        mode.set_defaults(func=run)
    from nanocore.bench import moe as moe_bench  # a kernel microbench: no engine, its own flags
    moe_bench.add_arguments(sub.add_parser("moe", help="MoE executors on random routed tokens: fused vs eager"))
    sub.choices["moe"].set_defaults(func=moe_bench.run_from_args)
    from nanocore.bench import linear as linear_bench  # a kernel microbench: every linear method vs unquantized
    linear_bench.add_arguments(sub.add_parser("linear", help="linear methods on one decoder layer's shapes vs "
                                                             "unquantized, over M tokens"))
    sub.choices["linear"].set_defaults(func=linear_bench.run_from_args)
