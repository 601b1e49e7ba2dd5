"""``nanocore serve``: the OpenAI-compatible HTTP server (completions, chat, models, tokenize, detokenize, health,
version, metrics).

Engine flags, ``--config FILE.toml`` and ``NANOCORE_*`` environment choose the model and backends exactly as
for ``LLM(...)``; ``GET /version`` reports the backends in use.
"""
from __future__ import annotations

import logging
import os

from nanocore.cli.common import add_engine_args, engine_config_from_args
from nanocore.serve.body_limit import DEFAULT_MAX_BODY_MIB
from nanocore.serve.tool_parsers import TOOL_CALL_PARSER_CHOICES

API_KEY_ENV = "NANOCORE_API_KEY"


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (default model, CPU or GPU)",
                              description=__doc__)
    s = add_server_args(p)
    s.add_argument("--engine-process", choices=["auto", "on", "off"], default="auto",
                   help="run the engine in its own process, so HTTP work and engine steps do not share one GIL "
                        "(default auto: on for a GPU, off for the CPU, whose steps are compute-bound anyway)")
    add_engine_args(p)
    p.set_defaults(func=run)


def add_server_args(parser):
    """The HTTP flags (``nanocore serve`` and ``nanocore serve-ray``); returns their group."""
    s = parser.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model)")
    s.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1 routes (or set {API_KEY_ENV})")
    s.add_argument("--max-waiting-requests", type=int, default=1024,
                   help="requests queued but not yet running before new ones get HTTP 429 (default 1024)")
    s.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM before they are aborted (default 30)")
    s.add_argument("--max-body-mib", type=float, default=DEFAULT_MAX_BODY_MIB,
                   help=f"largest request body in MiB; a larger one gets HTTP 413 (default {DEFAULT_MAX_BODY_MIB:g})")
    s.add_argument("--stream-interval", type=int, default=1,
                   help="tokens per streamed chunk after the first (default 1; larger = less HTTP work per token)")
    s.add_argument("--chat-template", default=None, metavar="FILE_OR_TEXT",
                   help="Jinja chat template (a file, or the template text) used instead of the tokenizer's")
    s.add_argument("--tool-call-parser", default="auto", choices=TOOL_CALL_PARSER_CHOICES,
                   help="how tool calls are found in the output for tool_choice 'auto' (default auto: from the "
                        "chat template's markers, else the model's architecture)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return s


def check_server_args(args) -> None:
    if args.max_waiting_requests < 1:
        raise ValueError(f"--max-waiting-requests must be >= 1, got {args.max_waiting_requests}")
    if not args.max_body_mib > 0:
        raise ValueError(f"--max-body-mib must be > 0, got {args.max_body_mib}")
    if args.stream_interval < 1:
        raise ValueError(f"--stream-interval must be >= 1 (tokens per streamed chunk), got {args.stream_interval}")


def run(args) -> int:
    from nanocore.engine.llm import LLM
    from nanocore.serve.prompts import load_chat_template
    from nanocore.serve.server import create_app, create_process_app, serve

    check_server_args(args)
    config = engine_config_from_args(args)  # config errors before the model loads
    load_chat_template(args.chat_template)
    logging.getLogger("nanocore").setLevel(logging.INFO)
    api_key = args.api_key or os.environ.get(API_KEY_ENV)
    if use_engine_process(args.engine_process, config.device):
        app = create_process_app(config, args.served_model_name, api_key, args.max_waiting_requests,
                                 args.drain_timeout, args.stream_interval, args.log_level, args.max_body_mib,
                                 chat_template=args.chat_template, tool_call_parser=args.tool_call_parser)
    else:
        app = create_app(LLM(config=config), args.served_model_name, api_key, args.max_waiting_requests,
                         args.drain_timeout, args.stream_interval, args.max_body_mib,
                         chat_template=args.chat_template, tool_call_parser=args.tool_call_parser)
    backends = app.state.serve.backends
    print(f"nanocore serve: {app.state.serve.served_model_name} on http://{args.host}:{args.port}/v1 "
          f"({', '.join(f'{k}={v}' for k, v in backends.items())})", flush=True)
    serve(app, args.host, args.port, args.drain_timeout, args.log_level)
    return 0


def use_engine_process(choice: str, device: str) -> bool:
    from nanocore.distributed.launcher import launched_rank

    if launched_rank() is not None:  # every rank builds the engine where the launcher started it
        if choice == "on":
            raise ValueError("--engine-process on: under torchrun each rank runs the engine in its own process; "
                             "drop the flag")
        return False
    if choice != "auto":
        return choice == "on"
    if device == "auto":
        import torch
        return torch.cuda.is_available()
    return device.startswith("cuda")
