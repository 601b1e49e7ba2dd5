"""``nanocore eval ppl`` (perplexity through the engine) and ``nanocore eval compare`` (A vs B agreement)."""
from __future__ import annotations

import sys
from pathlib import Path

from nanocore.cli.common import add_engine_args, engine_config_from_args, parse_inline_config
from nanocore.config import engine_table

PPL_COLUMNS = ["model", "linear_method", "kv_codec", "tokens", "windows", "nll", "perplexity", "tok/s"]
COMPARE_COLUMNS = ["prompt", "prompt_tokens", "greedy_agreement", "first_divergence", "top1_agreement",
                   "max_abs_logprob_diff", "mean_kl"]


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="quality checks: perplexity, backend agreement")
    sub = p.add_subparsers(dest="eval_command", metavar="EVAL")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    ppl = sub.add_parser("ppl", help="teacher-forced perplexity through the engine's own forward")
    ppl.add_argument("--text", type=Path, help="UTF-8 text file (default: gensim's Lee news corpus)")
    ppl.add_argument("--window", type=int, default=512, help="tokens per forward (default 512)")
    ppl.add_argument("--stride", type=int, default=None, help="tokens between window starts (default: window)")
    ppl.add_argument("--max-tokens", type=int, default=None, help="use only the first N corpus tokens")
    ppl.add_argument("--json", metavar="PATH", help="write the result as JSON")
    ppl.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_engine_args(ppl)
    ppl.set_defaults(func=run_ppl)

    cmp = sub.add_parser("compare", help="greedy-token and top-1 agreement of two backend combinations")
    cmp.add_argument("--a", required=True, metavar="CONFIG", help="TOML file or inline 'key=value,key=value'")
    cmp.add_argument("--b", required=True, metavar="CONFIG", help="TOML file or inline 'key=value,key=value'")
    cmp.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    cmp.add_argument("--prompts", type=Path, help="file with one prompt per line (default: a built-in set)")
    cmp.add_argument("--json", metavar="PATH", help="write the result as JSON")
    add_engine_args(cmp)
    cmp.set_defaults(func=run_compare)


def run_ppl(args) -> int:
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.engine.llm_engine import LLMEngine
    from nanocore.eval.perplexity import load_corpus_tokens, perplexity, result_dict

    config = engine_config_from_args(args)
    engine = LLMEngine(config)
    tokens = load_corpus_tokens(engine.tokenizer, args.text, args.max_tokens)
    window = min(args.window, engine.max_model_len)
    result = perplexity(engine, tokens, window, args.stride or window, progress=not args.no_progress)
    row = {"model": config.model, "linear_method": engine.loaded.linear_method, "kv_codec": engine.runner.codec.name,
           "tokens": result.num_tokens, "windows": result.num_windows, "nll": result.nll,
           "perplexity": result.perplexity, "tok/s": result.tokens_per_s}
    print(format_table([row], PPL_COLUMNS))
    write_json(args.json, {"command": "eval ppl", "text": str(args.text or "lee_background.cor"),
                           "result": result_dict(result), "backends": backend_names(engine),
                           "config": config_summary(config), "environment": environment(str(engine.device))})
    return 0


def backend_names(engine) -> dict[str, str]:
    return {"linear_method": engine.loaded.linear_method, "kv_codec": engine.runner.codec.name,
            "prefix_cache": engine.block_manager.prefix_cache.name, "scheduler_policy": engine.scheduler.policy_name}


def side_config(args, spec: str):
    """EngineConfig of one side: the shared flags, then the side's TOML file or inline fields."""
    if spec.endswith(".toml") or Path(spec).is_file():
        fields = engine_table(spec)
    else:
        fields = parse_inline_config(spec)
    return engine_config_from_args(args, **fields)


def run_compare(args) -> int:
    from nanocore.bench.report import config_summary, environment, format_table, write_json
    from nanocore.eval.compare import compare

    config_a, config_b = side_config(args, args.a), side_config(args, args.b)
    prompts = None
    if args.prompts:
        prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()]
    result = compare(config_a, config_b, prompts, args.max_tokens)
    print(format_table(result["rows"], COMPARE_COLUMNS))
    s = result["summary"]
    print(f"\nA = {args.a}\nB = {args.b}\ngreedy token agreement {s['greedy_agreement']:.4f} "
          f"({s['exact_greedy_matches']}/{s['prompts']} identical), top-1 agreement {s['top1_agreement']:.4f}, "
          f"max |dlogprob| {s['max_abs_logprob_diff']:.4g}, mean KL {s['mean_kl']:.4g}", file=sys.stdout)
    write_json(args.json, {"command": "eval compare", "a": args.a, "b": args.b, **result,
                           "config_a": config_summary(config_a), "config_b": config_summary(config_b),
                           "environment": environment(config_a.device)})
    return 0
