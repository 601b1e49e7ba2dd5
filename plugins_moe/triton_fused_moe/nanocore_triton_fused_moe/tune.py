"""Search tile configs for one expert shape on this GPU and write the table ``ConfigTable`` reads.

For each token count the candidates are timed (CUDA events, median) on random routed inputs; the
fastest wins. Candidates that do not compile on this GPU (out of shared memory) are skipped. With
``weight_format="fp8_channel"`` the experts are fp8 with per-row scales and the table is the fp8 one.
"""
from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import torch

from nanocore.toolkit.timing import time_ms
from nanocore_triton_fused_moe.align import align_slots
from nanocore_triton_fused_moe.configs import config_file_name, device_name, triton_version, user_config_dir

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def candidate_configs(num_tokens: int, num_experts: int, top_k: int, quick: bool = False) -> list[dict]:
    """Tiles worth trying: ``BLOCK_M`` near the rows each expert receives, the rest from a small grid."""
    rows = num_tokens * top_k / num_experts
    block_ms = [m for m in (16, 32, 64, 128) if m <= max(16, 2 * rows)][-2:]
    grid = dict(BLOCK_N=(64, 128), BLOCK_K=(64, 128), GROUP_M=(1, 16), num_warps=(4, 8), num_stages=(3, 4))
    if quick:
        grid.update(GROUP_M=(8,), num_warps=(4,), num_stages=(3,))
    keys = list(grid)
    return [dict(BLOCK_M=bm, **dict(zip(keys, values)))
            for bm in block_ms for values in itertools.product(*(grid[k] for k in keys))]


def time_config(config: dict, args, top_k: int, scales: dict | None = None) -> float | None:
    """Median milliseconds of both GEMMs with ``config``, or None if it does not compile here."""
    from nanocore_triton_fused_moe.kernels import fused_experts

    x, topk_weights, topk_ids, w13, w2 = args
    try:
        aligned = align_slots(topk_ids, w13.shape[0], config["BLOCK_M"])
        run = lambda: fused_experts(x, topk_weights, w13, w2, aligned, top_k, config, **(scales or {}))  # noqa: E731
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # triton raises OutOfResources and friends for tiles too big for this GPU
        if "resources" not in type(exc).__name__.lower() and "shared memory" not in str(exc).lower():
            raise
        return None
    return time_ms(run, min_iters=10, budget_ms=0.0)


def tune(num_experts: int, intermediate: int, hidden: int, top_k: int, dtype: torch.dtype = torch.bfloat16,
         batch_sizes=DEFAULT_BATCH_SIZES, output_dir: str | Path | None = None, quick: bool = False,
         time_budget_s: float | None = None, log=print, weight_format: str = "float") -> Path:
    """Tune every batch size in ``batch_sizes`` and write ``output_dir/<config file name>``.

    ``output_dir`` defaults to ``user_config_dir()``, which the executor searches at run time.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("tuning the fused MoE kernels needs an NVIDIA GPU; run 'nanocore tune moe' on the GPU machine")
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    w13 = (torch.randn(num_experts, 2 * intermediate, hidden, device=device, generator=g) * hidden ** -0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, intermediate, device=device, generator=g) * intermediate ** -0.5).to(dtype)
    scales = None
    if weight_format == "fp8_channel":
        from nanocore.toolkit.moe_weights import quantize_fp8_experts

        w13, w13_scale, w2, w2_scale = quantize_fp8_experts(w13, w2)
        scales = {"w13_scale": w13_scale, "w2_scale": w2_scale}
    elif weight_format != "float":
        raise ValueError(f"weight_format must be 'float' or 'fp8_channel', got {weight_format!r}")
    started, table = time.monotonic(), {}
    for num_tokens in batch_sizes:
        if time_budget_s is not None and time.monotonic() - started > time_budget_s:
            log(f"time budget spent: stopping before M={num_tokens}")
            break
        x = torch.randn(num_tokens, hidden, device=device, generator=g).to(dtype)
        logits = torch.randn(num_tokens, num_experts, device=device, generator=g)
        topk_weights, topk_ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
        timed = [(time_config(c, (x, topk_weights, topk_ids, w13, w2), top_k, scales), c)
                 for c in candidate_configs(num_tokens, num_experts, top_k, quick)]
        timed = [(ms, c) for ms, c in timed if ms is not None]
        if not timed:
            raise RuntimeError(f"no candidate config compiled for M={num_tokens}; check the Triton install")
        best_ms, best = min(timed, key=lambda t: t[0])
        table[str(num_tokens)] = best
        log(f"M={num_tokens:5d}: {best_ms:.3f} ms with {best} ({len(timed)} configs timed)")
    path = Path(output_dir or user_config_dir()) / config_file_name(num_experts, intermediate, dtype, device_name(device),
                                                                    triton_version(), weight_format)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    log(f"wrote {path}")
    return path
