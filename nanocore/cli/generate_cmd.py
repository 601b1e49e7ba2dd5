"""``nanocore generate`` (one completion, printed or streamed) and ``nanocore chat`` (a REPL on stdin)."""
from __future__ import annotations

import argparse
import sys

from nanocore.cli.common import add_engine_args, engine_config_from_args


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int = 64) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default {max_tokens})")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 = whole vocabulary")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--sampling-seed", type=int, default=None, help="per-request seed (reproducible sampling)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="complete a prompt and print the text")
    p.add_argument("--prompt", required=True, help="text to complete")
    p.add_argument("--stream", action="store_true", help="print the text as it is generated")
    p.add_argument("--show-stats", action="store_true", help="print engine stats to stderr")
    add_sampling_args(p)
    add_engine_args(p)
    p.set_defaults(func=run_generate)

    c = subparsers.add_parser("chat", help="chat with the model (reads lines from stdin; /exit quits)")
    c.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(c, max_tokens=256)
    add_engine_args(c)
    c.set_defaults(func=run_chat)


def sampling_params_from_args(args):
    from nanocore.engine.sampling_params import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          seed=args.sampling_seed, max_tokens=args.max_tokens, stop=args.stop,
                          ignore_eos=args.ignore_eos)


def run_generate(args) -> int:
    from nanocore.engine.llm import LLM

    params = sampling_params_from_args(args)  # parameter errors before the model loads
    llm = LLM(config=engine_config_from_args(args))
    if args.stream:
        for delta in llm.stream(args.prompt, params):
            print(delta, end="", flush=True)
        print()
    else:
        print(llm.generate(args.prompt, params, use_tqdm=False)[0].outputs[0].text)
    if args.show_stats:
        print(llm.stats(), file=sys.stderr)
    return 0


def run_chat(args) -> int:
    from nanocore.engine.llm import LLM

    params = sampling_params_from_args(args)
    llm = LLM(config=engine_config_from_args(args))
    history = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    if interactive:
        print("nanocore chat: type a message; /exit quits, /reset clears the history.")
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break  # end of input
        message = line.strip()
        if message in ("/exit", "/quit"):
            break
        if message == "/reset":
            history = history[:1] if args.system else []
            continue
        if not message:
            continue
        history.append({"role": "user", "content": message})
        prompt = llm.apply_chat_template(history)
        reply = ""
        for delta in llm.stream(prompt, params):
            reply += delta
            print(delta, end="", flush=True)
        print(flush=True)
        history.append({"role": "assistant", "content": reply.strip()})
    return 0
