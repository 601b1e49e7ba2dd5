"""The multi-GPU check's own logic, on CPU: the pass rule and the bench runner's cleanup of a stuck run."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from spawn_helpers import wait_until_gone  # noqa: E402

from benchmarks.tp_check import compare, layouts, run_process_group  # noqa: E402

RANK_BACKENDS = {"linear_method": "unquantized", "kv_codec": "unquantized", "moe_executor": None}


def _result(logits, tokens=((1, 2, 3),), blocks=(10, 10), ranks=(RANK_BACKENDS, RANK_BACKENDS), repeat=True):
    return {"logits": logits, "tokens": [list(t) for t in tokens], "kv_blocks_per_rank": list(blocks),
            "backends_per_rank": list(ranks), "repeat_identical": repeat}


def test_pass_rule():
    torch.manual_seed(0)
    ref = torch.randn(50, 11)
    noisy = ref + 1e-2 * torch.randn_like(ref)  # over the fp32 tolerance, argmax kept (gaps are far larger)
    assert noisy.argmax(-1).equal(ref.argmax(-1))
    assert not compare(_result(ref), _result(noisy), "float32")["ok"]
    assert compare(_result(ref), _result(noisy), "float32", quantized=True)["ok"]
    assert compare(_result(ref), _result(ref), "float32")["ok"]
    assert not compare(_result(ref), _result(ref, blocks=(10, 9)), "float32")["ok"]  # ranks disagree on KV
    other = {**RANK_BACKENDS, "kv_codec": "int8"}
    assert not compare(_result(ref), _result(ref, ranks=(other, RANK_BACKENDS)), "float32")["ok"]  # a worker differs
    assert not compare(_result(ref), _result(ref, repeat=False), "float32")["ok"]  # a second run gave other tokens
    wrong_decode = _result(ref, tokens=((1, 9, 9),))  # prompt logits fine, generated tokens not
    assert not compare(_result(ref), wrong_decode, "float32")["ok"]
    flipped = ref.clone()
    flipped[:5] = -flipped[:5]  # 10% of the positions change their top-1
    row = compare(_result(ref), _result(flipped), "bfloat16", quantized=True)
    assert row["top1_agreement"] < 0.99 and not row["ok"]
    assert layouts(2, "dense") == [(2, 1)] and layouts(2, "moe") == [(2, 1), (1, 2), (2, 2)]


def test_a_run_past_its_limit_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    start = time.monotonic()
    assert run_process_group([sys.executable, "-c", script], timeout_s=3) == "timeout"
    assert time.monotonic() - start < 20
    assert wait_until_gone(int(pid_file.read_text()), timeout_s=5), "the spawned grandchild survived"
    assert run_process_group([sys.executable, "-c", "pass"], timeout_s=30) == 0


def test_tp_smoke_runs_every_stage_on_gloo():
    """The first script to run on a new multi-GPU machine, here on two CPU ranks: every stage, then a clean close."""
    import os
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "NANOCORE_TRACE_WORKERS": "1"}
    result = subprocess.run([sys.executable, "-m", "benchmarks.tp_smoke", "--gpus", "2", "--device", "cpu"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for stage in ("engine built", "prompt_logits", "generate: [16, 16, 16] tokens", "closed",
                  "[nanocore rank 1", "left the process group"):
        assert stage in result.stderr, stage
