"""bench host_overhead: the stubbed-model decode loop runs (code path only; no timing assertion)."""
from __future__ import annotations

from nanocore.bench.host_overhead import main


def test_host_overhead_runs_a_few_decode_steps(capsys):
    assert main(["--num-seqs", "16", "--steps", "3", "--repeats", "1", "--prompt-len", "20", "--max-tokens", "8",
                 "--profile", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "host_ms_per_decode_step=" in out and "function calls" in out
