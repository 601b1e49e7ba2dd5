"""One Qwen1.5-MoE-A2.7B MoE layer on one GPU: the shared expert on a side stream (overlap) vs sequential.

Usage, from the repo root after ``source benchmarks/gpu_setup.sh``:
    python3 benchmarks/moe_shared_overlap_gpu.py OUTDIR [BUDGET_S=60]
Expected wall time about 30 to 50 s including Triton compiles, under 90 s: no new case starts past BUDGET_S.
Writes OUTDIR/shared_overlap.json after every case and prints a table.

Layer: ``SparseMoeBlock`` built from the Qwen1.5-MoE-A2.7B preset (60 experts top-4, I 1408, shared expert
I 5632 with its sigmoid gate, H 2048), dummy bf16 weights. For M in 1, 16, 256 tokens, with the
``triton_fused_moe`` executor: the layer forward launched from Python ("eager") and as a CUDA-graph replay,
overlap off vs on; the two branches alone as graphs (routed = router + experts, shared = gated shared
expert) give the ideal overlapped time max(routed, shared) against the sequential sum. With the ``eager``
executor (host-synchronising, the 51.7 ms TPOT case) the launched forward only. Every case checks that
overlap on == off bit for bit (eager, graph, graph vs eager). Timing: CUDA events, median of >= 5 calls
(``nanocore.toolkit.timing.time_ms``), two rounds alternating off/on; the smaller median of the two is kept.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

from nanocore.bench.moe import environment
from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore.distributed import ParallelContext
from nanocore.loader.dummy import init_dummy_weights
from nanocore.loader.presets import preset_config
from nanocore.models import ModelBuildContext
from nanocore.models.decoder import DecoderOptions
from nanocore.models.qwen2_moe import SparseMoeBlock
from nanocore.toolkit.timing import capture, time_ms
from nanocore_triton_fused_moe import TritonFusedMoEExecutor

PRESET = "Qwen1.5-MoE-A2.7B"
TOKENS = (1, 16, 256)
EAGER_EXECUTOR_TOKENS = (1, 16)  # the per-expert loop is slow; decode sizes are the point
ROUNDS = 2


def make_block(cfg, executor) -> SparseMoeBlock:
    build = ModelBuildContext(dtype=torch.bfloat16, device=torch.device("cuda"), parallel=ParallelContext(),
                              linear_method_factory=lambda prefix: UnquantizedLinearMethod(), moe_executor=executor)
    with torch.device("cuda"):
        block = SparseMoeBlock(cfg, build, DecoderOptions(qkv_bias=True), "model.layers.0.mlp")
    init_dummy_weights(block, seed=0, std=0.02)
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 0.5)  # decisive, token-dependent routing
    return block.eval()


def with_overlap(block, enabled: bool, fn):
    def run():
        block.overlap.enabled = enabled
        return fn()
    return run


def timed_pair(block, make_fn) -> dict:
    """{"off": ms, "on": ms}: alternating rounds, the smaller median of each."""
    times = {"off": [], "on": []}
    for _ in range(ROUNDS):
        for key, enabled in (("off", False), ("on", True)):
            times[key].append(time_ms(make_fn(enabled)))
    return {key: round(min(values), 4) for key, values in times.items()}


def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float((a.float() - b.float()).abs().max())}


def fused_case(block, num_tokens: int) -> dict:
    x = torch.randn(num_tokens, block.gate.weight.shape[1], device="cuda", dtype=torch.bfloat16)
    row = {"executor": "triton_fused_moe", "tokens": num_tokens}
    eager = {e: with_overlap(block, e, lambda: block(x))().clone() for e in (False, True)}
    row["check_eager_on_vs_off"] = diff(eager[True], eager[False])
    graphs = {e: capture(with_overlap(block, e, lambda: block(x))) for e in (False, True)}
    for graph, _ in graphs.values():
        graph.replay()
    torch.cuda.synchronize()
    row["check_graph_on_vs_off"] = diff(graphs[True][1], graphs[False][1])
    row["check_graph_vs_eager"] = diff(graphs[True][1], eager[False])
    row["eager_ms"] = timed_pair(block, lambda e: with_overlap(block, e, lambda: block(x)))
    row["graph_ms"] = timed_pair(block, lambda e: graphs[e][0].replay)
    routed, _ = capture(lambda: block.experts(x, block.gate(x)))
    shared, _ = capture(lambda: block.gated_shared_expert(x))
    row["graph_branch_ms"] = {"routed": round(time_ms(routed.replay), 4), "shared": round(time_ms(shared.replay), 4)}
    return row


def eager_executor_case(block, num_tokens: int) -> dict:
    x = torch.randn(num_tokens, block.gate.weight.shape[1], device="cuda", dtype=torch.bfloat16)
    row = {"executor": "eager", "tokens": num_tokens}
    outs = {e: with_overlap(block, e, lambda: block(x))().clone() for e in (False, True)}
    row["check_eager_on_vs_off"] = diff(outs[True], outs[False])
    row["eager_ms"] = timed_pair(block, lambda e: with_overlap(block, e, lambda: block(x)))
    return row


def summary_line(row: dict) -> str:
    checks = all(v["equal"] for k, v in row.items() if k.startswith("check_"))
    e, g = row.get("eager_ms", {}), row.get("graph_ms")
    text = f"{row['executor']:>16} M={row['tokens']:<4} eager off {e.get('off', 0):7.3f} on {e.get('on', 0):7.3f} ms"
    if g:
        b = row["graph_branch_ms"]
        text += (f" | graph off {g['off']:.4f} on {g['on']:.4f} ms (saves {g['off'] - g['on']:+.4f}) | "
                 f"routed {b['routed']:.4f} shared {b['shared']:.4f}")
    return text + f" | bitwise equal: {checks}"


def main(out_dir: Path, budget_s: float) -> int:
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = preset_config(PRESET)
    results = {"environment": environment(), "preset": PRESET, "num_layers": cfg.num_hidden_layers,
               "rows": [], "errors": []}

    def save():
        results["elapsed_s"] = round(time.monotonic() - started, 1)
        (out_dir / "shared_overlap.json").write_text(json.dumps(results, indent=1))

    cases = [("fused", m) for m in TOKENS] + [("eager", m) for m in EAGER_EXECUTOR_TOKENS]
    blocks = {"fused": make_block(cfg, TritonFusedMoEExecutor()), "eager": make_block(cfg, EagerMoEExecutor())}
    with torch.inference_mode():
        for kind, m in cases:
            if time.monotonic() - started > budget_s:
                results["errors"].append(f"{kind} M={m}: skipped, past the {budget_s:.0f} s budget")
                continue
            try:
                row = (fused_case if kind == "fused" else eager_executor_case)(blocks[kind], m)
                for key in ("eager_ms", "graph_ms"):  # what the overlap saves per decode step, all layers together
                    if key in row:
                        saved = (row[key]["off"] - row[key]["on"]) * cfg.num_hidden_layers
                        row[key.replace("_ms", "_saving_all_layers_ms")] = round(saved, 3)
                results["rows"].append(row)
                print(summary_line(row), flush=True)
            except Exception as exc:  # record and go on: one GPU call should bring back every case it can
                results["errors"].append(f"{kind} M={m}: {exc!r}\n{traceback.format_exc(limit=4)}")
                print(f"{kind} M={m}: FAILED {exc!r}", flush=True)
            save()
    save()
    print(f"done in {results['elapsed_s']} s; {len(results['errors'])} errors; "
          f"x {results['num_layers']} layers for a model-level estimate")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: moe_shared_overlap_gpu.py OUTDIR [BUDGET_S]")
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 60.0))
