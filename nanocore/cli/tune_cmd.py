"""``nanocore tune moe --model M``: tune an MoE executor's kernels for a model's expert shape on this GPU;
``nanocore tune linear``: time each weight-only linear method's kernels per M (``nanocore.bench.linear_tune``).

The shape comes from the model's config (a checkpoint folder or ``dummy:PRESET``) and the parallel
layout: expert parallel splits the experts, tensor parallel (without EP) splits each expert's
intermediate size. The executor must offer a ``tune`` classmethod (``triton_fused_moe`` does); the
table it writes is picked up automatically from the default output folder.
"""
from __future__ import annotations

import argparse

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def register(subparsers) -> None:
    parser = subparsers.add_parser("tune", help="tune kernels for a model on this GPU (writes a config JSON)")
    kinds = parser.add_subparsers(dest="tune_kind", metavar="KIND", required=True)
    moe = kinds.add_parser("moe", help="tile configs of the fused MoE kernels for a model's expert shape")
    moe.add_argument("--model", required=True, help="checkpoint folder or dummy:PRESET (e.g. dummy:Qwen3-30B-A3B)")
    moe.add_argument("--executor", default="triton_fused_moe", help="MoE executor whose kernels to tune")
    moe.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    moe.add_argument("--tensor-parallel-size", "--tp", type=int, default=1, dest="tp")
    moe.add_argument("--expert-parallel-size", "--ep", type=int, default=1, dest="ep")
    moe.add_argument("--batch-sizes", default=None, help="comma-separated token counts (default: 1..4096, powers of two)")
    moe.add_argument("--output-dir", default=None, help="where to write the JSON (default: the user config folder searched at run time)")
    moe.add_argument("--quick", action="store_true", help="a small grid of candidates (minutes -> seconds)")
    moe.add_argument("--weight-format", default="float", choices=["float", "fp8_channel"],
                     help="expert weights to tune for: float (the dtype) or fp8_channel (fp8 experts, their own table)")
    moe.set_defaults(func=run_tune_moe)
    linear = kinds.add_parser("linear", help="time every kernel of the weight-only linear methods per M (GPU)")
    linear.add_argument("--methods", default=None, help="comma-separated methods (default int8_w8a16,fp8_w8a16,awq)")
    linear.add_argument("--shapes", default="llama-3.1-8b", help="layer shapes of `bench linear` (default Llama-3.1-8B)")
    linear.add_argument("--ms", default="1,16,32,64,256,512,1024,4096", help="comma-separated token counts M")
    linear.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    linear.add_argument("--json", metavar="PATH", help="write every timing as JSON")
    linear.set_defaults(func=run_tune_linear)


def run_tune_linear(args: argparse.Namespace) -> int:
    from nanocore.bench.linear_tune import run_tune_linear as run

    if not torch.cuda.is_available():
        raise RuntimeError("nanocore tune linear times GPU kernels: run it on a machine with a CUDA GPU")
    return run(args)


def expert_shape(hf_config, tp: int, ep: int) -> dict:
    """Per-rank (num_experts, intermediate, hidden, top_k) of a MoE model's config."""
    num_experts = getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
    if not num_experts:
        raise ValueError(f"the model ({getattr(hf_config, 'architectures', '?')}) has no experts to tune; choose a MoE model")
    intermediate = getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size
    for what, total, parts in (("num_experts", num_experts, ep), ("moe_intermediate_size", intermediate, tp if ep == 1 else 1)):
        if total % parts:
            raise ValueError(f"{what} {total} does not split over {parts} ranks; choose a parallel size that divides it")
    return dict(num_experts=num_experts // ep, intermediate=intermediate // (tp if ep == 1 else 1),
                hidden=hf_config.hidden_size, top_k=hf_config.num_experts_per_tok)


def run_tune_moe(args: argparse.Namespace) -> int:
    from nanocore.loader.model_loader import resolve_model_source
    from nanocore.plugins import get_registry

    hf_config, _ = resolve_model_source(args.model)
    shape = expert_shape(hf_config, args.tp, args.ep)
    executor = get_registry().resolve("moe_executor", args.executor, "cuda").cls
    if not hasattr(executor, "tune"):
        raise ValueError(f"MoE executor {args.executor!r} has no tunable kernels; try --executor triton_fused_moe")
    kwargs = {"quick": args.quick}
    if args.weight_format != "float":  # only then: an executor's tune() of API 1.1 need not know the keyword
        kwargs["weight_format"] = args.weight_format
    if args.batch_sizes:
        kwargs["batch_sizes"] = [int(m) for m in args.batch_sizes.split(",")]
    if args.output_dir:
        kwargs["output_dir"] = args.output_dir
    print(f"tuning {args.executor} for {args.model}: {shape}, {args.dtype}")
    path = executor.tune(dtype=DTYPES[args.dtype], **shape, **kwargs)
    print(f"wrote {path}")
    return 0
