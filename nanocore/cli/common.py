"""Flags shared by every command that builds an engine, and the EngineConfig they make.

Precedence (lowest first): defaults, ``--config FILE.toml``, ``NANOCORE_*`` environment, flags.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from nanocore.interfaces import KINDS

ENGINE_FLAGS = {  # flag -> EngineConfig field
    "model": "model", "tokenizer": "tokenizer", "dtype": "dtype", "device": "device",
    "max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens", "block_size": "block_size",
    "num_kv_blocks": "num_kv_blocks", "cpu_kv_cache_gib": "cpu_kv_cache_gib",
    "gpu_memory_utilization": "gpu_memory_utilization", "enforce_eager": "enforce_eager",
    "kernel_warmup": "kernel_warmup", "cuda_graph_mixed": "cuda_graph_mixed",
    "async_scheduling": "async_scheduling", "moe_shared_expert_overlap": "moe_shared_expert_overlap",
    "tensor_parallel_size": "tensor_parallel_size", "expert_parallel_size": "expert_parallel_size", "seed": "seed",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Model, device, memory and the five backend choices (each with a ``--<kind>-options`` JSON)."""
    g = parser.add_argument_group("engine")
    g.add_argument("--config", metavar="FILE.toml", help="EngineConfig TOML file (flags override it)")
    g.add_argument("--model", help="checkpoint folder, 'dummy:PRESET', or 'default' (SmolLM2-135M-Instruct)")
    g.add_argument("--tokenizer", help="tokenizer folder (default: the model's)")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", help="cpu, cuda, cuda:N or auto")
    g.add_argument("--max-model-len", type=int, help="longest prompt + output")
    g.add_argument("--max-num-seqs", type=int, help="sequences per step")
    g.add_argument("--max-num-batched-tokens", type=int, help="tokens per step")
    g.add_argument("--block-size", type=int, help="tokens per KV block")
    g.add_argument("--num-kv-blocks", type=int, help="fix the KV-cache size in blocks")
    g.add_argument("--cpu-kv-cache-gib", type=float, help="KV-cache memory on CPU")
    g.add_argument("--gpu-memory-utilization", type=float, help="fraction of GPU memory to use")
    g.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs")
    g.add_argument("--cuda-graph-mixed", action=argparse.BooleanOptionalAction, default=None,
                   help="piecewise CUDA graphs for steps with prefill chunks of up to 512 tokens (default: on with one "
                   "GPU, off with tensor / expert parallelism)")
    g.add_argument("--kernel-warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="compile every Triton kernel variant serving can select before ready (default on, CUDA)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap the next decode step with this one's host work (default on)")
    g.add_argument("--moe-shared-expert-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="run an MoE layer's shared expert on a side CUDA stream (default on)")
    g.add_argument("--tensor-parallel-size", type=int, help="GPUs per model")
    g.add_argument("--expert-parallel-size", type=int, help="ranks sharing a MoE model's experts")
    g.add_argument("--seed", type=int, help="seed of dummy weights and unseeded sampling")
    g.add_argument("--threads", type=int, help="CPU threads for torch (1 is fastest on a busy machine)")
    b = parser.add_argument_group("backends (a registered name or 'auto'; see 'nanocore plugins')")
    for kind in KINDS:
        flag = kind.replace("_", "-")
        b.add_argument(f"--{flag}", dest=kind, metavar="NAME", help=f"{kind.replace('_', ' ')} backend")
        b.add_argument(f"--{flag}-options", dest=f"{kind}_options", metavar="JSON", type=json_object,
                       help=f"options of the {kind.replace('_', ' ')} backend, e.g. '{{\"key\": 1}}'")


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}); write e.g. '{{\"chunk_size\": 128}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config fields given on the command line (absent flags are left to the file / environment)."""
    fields = {field: getattr(args, flag, None) for flag, field in ENGINE_FLAGS.items()}
    for kind in KINDS:
        fields[kind] = getattr(args, kind, None)
        fields[f"{kind}_options"] = getattr(args, f"{kind}_options", None)
    return {k: v for k, v in fields.items() if v is not None}


def config_error_lines(exc) -> list[str]:
    """A pydantic ValidationError of EngineConfig as one line per problem, naming the three places to fix it."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ())) or "config"
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        if error.get("type") != "value_error":  # our own validators already quote the value and say what to do
            message += f", got {error.get('input')!r}"
        name = field.split(".")[0]
        if error.get("type") == "extra_forbidden":
            lines.append(f"{field}: not an engine field (from the --config file or NANOCORE_{name.upper()}); remove "
                         f"it, or see 'nanocore generate --help' for the fields")
            continue
        where = f"--{name.replace('_', '-')}, '{name}' in the --config file or NANOCORE_{name.upper()}"
        lines.append(f"{field}: {message} (set by {where})")
    return lines


def engine_config_from_args(args: argparse.Namespace, **extra: Any):
    """EngineConfig from ``--config``, ``NANOCORE_*`` and the flags (``extra`` overrides all)."""
    from nanocore.config import EngineConfig

    apply_threads(args)
    return EngineConfig.load(getattr(args, "config", None), **{**engine_overrides(args), **extra})


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
