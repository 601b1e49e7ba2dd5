"""``nanocore`` console script: each subcommand lives in its own module under nanocore/cli/."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

#: Subcommand modules; each defines ``register(subparsers)`` which sets ``func(args) -> int``.
COMMAND_MODULES = [
    "nanocore.cli.plugins_cmd",
    "nanocore.cli.plugin_new_cmd",
    "nanocore.cli.conformance_cmd",
    "nanocore.cli.generate_cmd",
    "nanocore.cli.eval_cmd",
    "nanocore.cli.bench_cmd",
    "nanocore.cli.quantize_cmd",
    "nanocore.cli.tune_cmd",
    "nanocore.cli.serve_cmd",
    "nanocore.ray.serve_ray_cmd",  # imports ray only when run (an optional extra)
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanocore", description="nanocore: a small LLM inference engine with plugin backends")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine and registry decide")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # command not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # buffered output meets a closed pipe here, inside the handler below
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nanocore plugins | head`: the reader left; stop quietly like other CLI tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not fail too
        return 141
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        # user errors (bad backend names, parameters, checkpoints) get a message, not a traceback
        if args.verbose:
            raise
        for line in error_lines(exc):
            print(f"error: {line}", file=sys.stderr)
        return 1


def error_lines(exc: Exception) -> list[str]:
    """A config error as one line per problem (not pydantic's block with its URLs); else the message."""
    from pydantic import ValidationError

    from nanocore.config import ConfigError, config_error_lines

    if isinstance(exc, ConfigError):
        return exc.lines
    if isinstance(exc, ValidationError):
        return config_error_lines(exc)
    return [str(exc)]


if __name__ == "__main__":
    sys.exit(main())
