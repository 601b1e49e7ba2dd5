"""`nanocore bench moe`: the local expert computation of one MoE layer, executor against executor.

For each expert shape and token count: random routed tokens (softmax top-k of random router logits)
and random expert weights; each executor's ``apply`` is timed as launched from Python and, when it
declares ``supports_cuda_graph``, as a CUDA-graph replay (how decode runs it). Effective bandwidth
counts the weights of the experts that received tokens, read once. ``--weight-formats float,fp8_channel`` also times
every executor that takes fp8 experts on the same weights rounded to fp8 per row (columns ``NAME+fp8``, one byte
per weight). Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass

import torch

from nanocore.toolkit.timing import graph_replay, time_ms


@dataclass(frozen=True)
class ExpertShape:
    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int


#: The issue's cases: a small 8-expert top-1 layer and two real models' expert shapes.
SHAPES = {
    "8e-top1": ExpertShape("8 experts top-1 (H 2048, I 2048)", 8, 1, 2048, 2048),
    "qwen1.5-moe": ExpertShape("Qwen1.5-MoE-A2.7B (60 experts top-4, H 2048, I 1408)", 60, 4, 2048, 1408),
    "qwen3-30b-a3b": ExpertShape("Qwen3-30B-A3B (128 experts top-8, H 2048, I 768)", 128, 8, 2048, 768),
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_inputs(shape: ExpertShape, num_tokens: int, dtype: torch.dtype, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    h, i, e = shape.hidden, shape.intermediate, shape.num_experts
    x = torch.randn(num_tokens, h, device=device, dtype=dtype, generator=g)
    logits = torch.randn(num_tokens, e, device=device, generator=g)
    topk_weights, topk_ids = torch.softmax(logits, -1).topk(shape.top_k, dim=-1)
    w13 = (torch.randn(e, 2 * i, h, device=device, generator=g) * h ** -0.5).to(dtype)
    w2 = (torch.randn(e, h, i, device=device, generator=g) * i ** -0.5).to(dtype)
    return x, topk_weights, topk_ids, w13, w2


FP8_SUFFIX = "+fp8"


def variants(executors: dict, weight_formats: list[str], device="cuda") -> dict:
    """``{column name: (executor, weight format)}``: every executor in float, ``NAME+fp8`` where it takes fp8."""
    out = {name: (executor, "float") for name, executor in executors.items()} if "float" in weight_formats else {}
    if "fp8_channel" in weight_formats:
        for name, executor in executors.items():
            if executor.supports_weight_format("fp8_channel", torch.device(device)) is None:
                out[name + FP8_SUFFIX] = (executor, "fp8_channel")
    if not out:
        raise ValueError(f"no executor runs weight formats {weight_formats} here")
    return out


def bench_case(executors: dict, shape: ExpertShape, num_tokens: int, dtype: torch.dtype, device="cuda") -> dict:
    """One row: milliseconds per executor (launched, and graph-replayed where declared); ``executors`` maps a column
    name to an executor, or to ``(executor, weight format)`` (see ``variants``)."""
    from nanocore.toolkit.moe_weights import quantize_fp8_experts

    args = make_inputs(shape, num_tokens, dtype, device)
    experts_hit = int(torch.unique(args[2]).numel())
    elements = experts_hit * 3 * shape.hidden * shape.intermediate
    row = {"shape": shape.name, "tokens": num_tokens, "experts_hit": experts_hit,
           "weight_bytes": elements * args[0].element_size(), "weight_elements": elements}
    fp8 = None
    for name, entry in executors.items():
        executor, weight_format = entry if isinstance(entry, tuple) else (entry, "float")
        call_args, scales = args, {}
        if weight_format == "fp8_channel":
            if fp8 is None:
                q13, s13, q2, s2 = quantize_fp8_experts(args[3], args[4])
                fp8 = (*args[:3], q13, q2), {"w13_scale": s13, "w2_scale": s2}
            call_args, scales = fp8

        def fn(executor=executor, call_args=call_args, scales=scales):
            return executor.apply(*call_args, **scales)
        row[f"{name}_ms"] = time_ms(fn)
        if executor.supports_cuda_graph:
            row[f"{name}_graph_ms"] = time_ms(graph_replay(fn))
    return row


def summarise(row: dict, baseline: str, names: list[str]) -> dict:
    """Speedups over ``baseline`` and effective weight bandwidth of the fastest timing of each executor."""
    for name in names:
        best = min(v for k, v in row.items() if k in (f"{name}_ms", f"{name}_graph_ms"))
        # fp8: one byte per weight (the per-row scales are negligible)
        weight_bytes = row["weight_elements"] if name.endswith(FP8_SUFFIX) else row["weight_bytes"]
        row[f"{name}_tb_per_s"] = weight_bytes / best / 1e9
        if name != baseline:
            row[f"{name}_speedup"] = row[f"{baseline}_ms"] / best
    return row


def run(executors: dict, shapes: list[ExpertShape], token_counts: list[int], dtype: torch.dtype,
        baseline: str = "eager") -> list[dict]:
    rows = []
    for shape in shapes:
        for num_tokens in token_counts:
            rows.append(summarise(bench_case(executors, shape, num_tokens, dtype), baseline, list(executors)))
            print(format_row(rows[-1], list(executors), baseline), flush=True)
    return rows


def format_row(row: dict, names: list[str], baseline: str) -> str:
    parts = [f"{row['shape'][:28]:28s} M={row['tokens']:5d}"]
    for name in names:
        graph = f" graph {row[f'{name}_graph_ms']:.3f}" if f"{name}_graph_ms" in row else ""
        speed = f" x{row[f'{name}_speedup']:.1f}" if name != baseline else ""
        parts.append(f"{name} {row[f'{name}_ms']:.3f} ms{graph}{speed}")
    return " | ".join(parts)


def environment() -> dict:
    import triton

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executors", default="eager,triton_fused_moe", help="comma-separated MoE executors; the first is the baseline")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated of {list(SHAPES)}")
    parser.add_argument("--tokens", default="1,16,64,256,1024", help="comma-separated token counts")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--weight-formats", default="float",
                        help="comma-separated expert weight formats: float, fp8_channel (columns NAME+fp8 for the "
                             "executors that take fp8 experts)")
    parser.add_argument("--output", default="bench_moe.json", help="JSON file for the results")


def run_from_args(args: argparse.Namespace) -> int:
    """Entry for ``nanocore bench moe``: executors resolved by name through the plugin registry."""
    from nanocore.plugins import get_registry

    if not torch.cuda.is_available():
        raise RuntimeError("nanocore bench moe needs an NVIDIA GPU (it times CUDA kernels)")
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        raise ValueError(f"unknown MoE shape(s) {unknown}; choose from {list(SHAPES)}")
    formats = args.weight_formats.split(",")
    unknown = [f for f in formats if f not in ("float", "fp8_channel")]
    if unknown:
        raise ValueError(f"unknown expert weight format(s) {unknown}; choose from ['float', 'fp8_channel']")
    names = args.executors.split(",")
    executors = variants({n: get_registry().build("moe_executor", n, "cuda") for n in names}, formats)
    rows = run(executors, [SHAPES[s] for s in args.shapes.split(",")],
               [int(t) for t in args.tokens.split(",")], DTYPES[args.dtype], baseline=next(iter(executors)))
    with open(args.output, "w") as f:
        json.dump({"environment": environment(), "dtype": args.dtype, "weight_formats": formats, "rows": rows,
                   "shapes": {k: asdict(v) for k, v in SHAPES.items()}}, f, indent=1)
    print(f"wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanocore bench moe", description=__doc__)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
