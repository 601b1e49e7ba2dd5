"""``nanocore bench interference`` on CPU with the tiny preset: table, JSON, PNG and the step structure."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def run_bench(tmp_path, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "nanocore.cli.main", "bench", "interference", "--device", "cpu",
           "--model", "dummy:tiny-qwen2", "--b-prompt-len", "256", "--warmup", "0", "--threads", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_interference_cpu_json_plot_and_step_structure(tmp_path):
    plot = tmp_path / "interference.png"
    extra = ["--plot", str(plot)] if _has_matplotlib() else []
    proc = run_bench(tmp_path, "--json", str(tmp_path / "i.json"), *extra)
    assert proc.returncode == 0, proc.stderr
    assert "decode_first_chunk1024" in proc.stdout and "a_max_itl_ms" in proc.stdout
    rows = {r["mode"]: r for r in json.loads((tmp_path / "i.json").read_text())["results"]}
    assert list(rows) == ["no_chunking", "prefill_first_chunk128", "decode_first_chunk128", "decode_first_chunk1024"]
    for row in rows.values():
        t = row["timeline"]
        assert len(t["a_token_ms"]) == 128 and t["a_token_ms"] == sorted(t["a_token_ms"])
        assert row["b_ttft_ms"] > 0 and row["a_max_itl_ms"] >= row["a_median_itl_ms"] > 0
    # steps after B arrives (after A's 8th token) until A's 9th token: B's 256-token prompt takes 2 chunks of 128
    gap = {mode: r["timeline"]["a_token_steps"][8] - r["timeline"]["a_token_steps"][7] for mode, r in rows.items()}
    assert gap == {"no_chunking": 2, "prefill_first_chunk128": 3, "decode_first_chunk128": 1,
                   "decode_first_chunk1024": 1}
    assert rows["decode_first_chunk128"]["steps"] == 128  # B rode along A's decodes: no extra step
    if extra:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_interference_rejects_unknown_mode(tmp_path):
    proc = run_bench(tmp_path, "--modes", "fastest")
    assert proc.returncode != 0 and "choose from" in proc.stderr


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True

