"""``nanocore bench MODE``: performance measurements that print a table and write JSON (``--json``).

Modes live in ``MODES`` (name -> (help, add_arguments, run)); the GPU modes (latency, prefill) plug in here.
"""
from __future__ import annotations

from nanocore.cli.common import add_engine_args, engine_config_from_args

THROUGHPUT_COLUMNS = ["model", "num_seqs", "prompt_tokens", "output_tokens", "seconds", "output_tokens_per_s",
                      "total_tokens_per_s", "preemptions"]


def add_throughput_args(p) -> None:
    p.add_argument("--num-seqs", type=int, default=16, help="sequences in the batch (default 16)")
    p.add_argument("--min-len", type=int, default=16, help="shortest prompt / output (default 16)")
    p.add_argument("--max-len", type=int, default=64, help="longest prompt / output (default 64)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--workload-seed", type=int, default=0, help="seed of the random workload (default 0)")
    p.add_argument("--progress", action="store_true", help="show a progress bar")


def run_throughput_cmd(args) -> int:
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.bench.throughput import result_dict, run_throughput
    from nanocore.engine.llm import LLM

    config = engine_config_from_args(args)
    llm = LLM(config=config)
    result = run_throughput(llm, args.num_seqs, args.min_len, args.max_len, args.temperature, args.workload_seed,
                            use_tqdm=args.progress)
    row = {"model": config.model, **result_dict(result)}
    print(format_table([row], THROUGHPUT_COLUMNS))
    write_json(args.json, {"command": "bench throughput", "workload": {
        "num_seqs": args.num_seqs, "min_len": args.min_len, "max_len": args.max_len,
        "temperature": args.temperature, "seed": args.workload_seed, "ignore_eos": True},
        "result": result_dict(result), "config": config_summary(config),
        "environment": environment(str(llm.engine.device))})
    return 0


#: mode -> (help, add_arguments(parser), run(args) -> exit code)
MODES = {
    "throughput": ("offline batch throughput (random prompts, ignore EOS)", add_throughput_args, run_throughput_cmd),
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
