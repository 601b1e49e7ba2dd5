"""Flags shared by every command that builds an engine, generated from EngineConfig's fields, and the config
they make.

Precedence (lowest first): defaults, ``--config FILE.toml``, ``NANOCORE_*`` environment, flags.
"""
from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any

from pydantic_core import PydanticUndefined

from nanocore.config import EngineConfig
from nanocore.interfaces import KINDS

CLI_ONLY_FLAGS = ("--config", "--threads")  # every other flag of the engine groups is an EngineConfig field


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field (``--max-model-len``, ``--kv-codec-options JSON``...), plus ``--config`` and
    ``--threads``. Absent flags stay None, leaving the field to the file, the environment or its default."""
    g = parser.add_argument_group("engine (EngineConfig fields; see docs/configuration.md)")
    g.add_argument("--config", metavar="FILE.toml", help="EngineConfig TOML file (flags override it)")
    g.add_argument("--threads", type=int, help="CPU threads for torch (1 is fastest on a busy machine)")
    b = parser.add_argument_group("backends (a registered name or 'auto'; see 'nanocore plugins')")
    for name, field in EngineConfig.model_fields.items():
        group = b if name.removesuffix("_options") in KINDS else g
        group.add_argument(engine_flag(name), dest=name, default=None, **flag_kwargs(name, field))


def engine_flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def flag_kwargs(name: str, field) -> dict[str, Any]:
    """argparse keywords for one pydantic field: the flag hands its text to EngineConfig, which converts and checks
    it as it does a NANOCORE_* variable (the same errors); a bool is --x / --no-x. Help: description and default."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None: the flag takes an X
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    origin = typing.get_origin(annotation)
    if annotation is bool:
        kwargs: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
    elif origin is typing.Literal:
        kwargs = {"metavar": "{" + ",".join(map(str, typing.get_args(annotation))) + "}"}
    elif origin is dict:
        kwargs = {"metavar": "JSON"}
    elif annotation in (int, float, str):
        kwargs = {"metavar": "NAME" if name in KINDS else None}
    else:
        raise TypeError(f"EngineConfig.{name}: no command-line form for {field.annotation}; teach flag_kwargs it")
    help_text = field.description or name.replace("_", " ")
    if field.default not in (None, PydanticUndefined) and "default" not in help_text:
        help_text += f" (default: {field.default})"
    return {**kwargs, "help": help_text.replace("%", "%%")}


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config fields given on the command line (absent flags are left to the file / environment)."""
    fields = {name: getattr(args, name, None) for name in EngineConfig.model_fields}
    return {k: v for k, v in fields.items() if v is not None}


def engine_config_from_args(args: argparse.Namespace, **extra: Any) -> EngineConfig:
    """EngineConfig from ``--config``, ``NANOCORE_*`` and the flags (``extra`` overrides all)."""
    apply_threads(args)
    return EngineConfig.load(getattr(args, "config", None), origin="flag", **{**engine_overrides(args), **extra})


def apply_threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        import torch
        torch.set_num_threads(args.threads)


def parse_inline_config(text: str) -> dict[str, Any]:
    """``key=value,key=value`` -> dict; values parse as JSON when they can (numbers, bools, objects)."""
    values: dict[str, Any] = {}
    for part in split_top_level(text):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"inline config {text!r}: {part!r} is not key=value (e.g. 'kv_codec=int8,block_size=32')")
        try:
            values[key.strip().replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip().replace("-", "_")] = raw.strip()
    return values


def split_top_level(text: str) -> list[str]:
    """Split on commas outside braces, so JSON option objects survive."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "{["
        depth -= ch in "}]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]
