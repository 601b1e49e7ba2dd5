"""One GPU session's figures for the README and docs/benchmarks-moe.md (see moe_run_on_gpu.sh).

Stages, each guarded by a time budget and saved as it finishes into $OUT/gpu_check.json:
quick tuning of the three bench shapes (bf16), then `nanocore bench moe` rows for eager, fused with the
batch-aware defaults, and fused with the freshly tuned tables. Imports nothing that needs pydantic.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from nanocore.bench.moe import SHAPES, environment, run
from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore_triton_fused_moe import TritonFusedMoEExecutor
from nanocore_triton_fused_moe.configs import config_file_name, device_name, triton_version
from nanocore_triton_fused_moe.tune import tune

OUT = Path(os.environ.get("OUT", "."))
BUDGET_S = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
TUNE_BATCHES = (1, 16, 64, 256, 1024, 4096)
BENCH_TOKENS = [1, 16, 64, 256, 1024]
started = time.monotonic()
results: dict = {"environment": environment(), "tables": {}, "bench": []}


def save() -> None:
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    (OUT / "gpu_check.json").write_text(json.dumps(results, indent=1))


def left() -> float:
    return BUDGET_S - (time.monotonic() - started)


default_fused = TritonFusedMoEExecutor()  # built before any table exists: batch-aware defaults
table_dir = OUT / "tables"
for key, shape in SHAPES.items():
    if left() < 0.55 * BUDGET_S:
        break
    path = tune(shape.num_experts, shape.intermediate, shape.hidden, shape.top_k, torch.bfloat16,
                batch_sizes=TUNE_BATCHES, output_dir=table_dir, quick=True, time_budget_s=0.15 * BUDGET_S)
    results["tables"][path.name] = json.loads(path.read_text())  # names with '=' and ',' do not travel back
    save()

executors = {"eager": EagerMoEExecutor(), "fused_default": default_fused,
             "fused": TritonFusedMoEExecutor({"config_dir": str(table_dir)})}
for shape in SHAPES.values():
    for tokens in BENCH_TOKENS:
        if left() < 0:
            break
        results["bench"].extend(run(executors, [shape], [tokens], torch.bfloat16))
        save()
results["gpu_name_key"] = device_name(torch.device("cuda"))
results["example_file_name"] = config_file_name(8, 2048, torch.bfloat16, results["gpu_name_key"], triton_version())
save()
print("done in", results["elapsed_s"], "s")
