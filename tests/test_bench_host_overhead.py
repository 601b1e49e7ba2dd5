"""bench host_overhead: the stubbed-model decode loop runs (code path only; no timing assertion)."""
from __future__ import annotations

from benchmarks.host_overhead import main


def test_host_overhead_runs_a_few_decode_steps(capsys):
    assert main(["--num-seqs", "16", "--steps", "3", "--repeats", "1", "--prompt-len", "20", "--max-tokens", "8",
                 "--profile", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "host_ms_per_decode_step=" in out and "function calls" in out


def test_cached_block_tables_match_a_fresh_build():
    from benchmarks.host_overhead import add_requests, build_llm
    from nanocore.runner.inputs import block_table_array

    llm = build_llm(8, 64, 8 * 4 + 4, 4)  # blocks cross the 16-token boundary during the steps
    engine, runner = llm.engine, llm.engine.runner
    add_requests(llm, 8, 10, 40)
    prepare = runner.prepare
    checked = []

    def checking_prepare(plan, all_logits=False):
        inputs = prepare(plan, all_logits)
        expected = block_table_array([s.block_table for s in engine.scheduler.batch.seqs])
        assert (inputs.meta.block_tables.numpy() == expected).all()
        checked.append(len(plan.rows))
        return inputs

    runner.prepare = checking_prepare
    while engine.has_unfinished_requests():
        engine.step()
    assert len(checked) > 20
