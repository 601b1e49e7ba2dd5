"""benchmarks/compile_check.py (a GPU check) on CPU: its workload drives the engine through the public API, and its
recorder separates compilations at start from late ones."""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from benchmarks.compile_check import CompileRecorder, workload  # noqa: E402
from engine_fakes import VOCAB, fake_loaded_model  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402


def test_workload_runs_every_part_on_the_cpu_engine():
    llm = LLM("fake", loaded_model=fake_loaded_model(max_model_len=512), block_size=4, num_kv_blocks=512,
              max_num_seqs=8, device="cpu", prefix_cache="none", scheduler_policy="prefill_first",
              kv_codec="unquantized")
    parts = workload(llm, random.Random(0), max_len=40, decode_batches=[1, 3], vocab=len(VOCAB))
    assert set(parts) == {"lengths_alone", "mixed_batches", "decode_batches", "cached_prefixes", "arrivals"}
    assert not llm.engine.has_unfinished_requests()


def test_recorder_counts_only_compilations_after_arm():
    recorder = CompileRecorder()
    recorder._record("k", "early spec")
    recorder.arm()
    recorder._record("k", "late spec")
    assert recorder.early == ["k: early spec"] and recorder.late == ["k: late spec"]


def test_main_writes_its_json_and_exits_zero_without_late_compiles(monkeypatch, tmp_path):
    import json

    import nanocore
    from benchmarks import compile_check

    def fake_llm(model, **fields):
        assert model == "dummy:Qwen3-0.6B" and fields["device"] == "cuda" and fields["kernel_warmup"] is True
        return LLM("fake", loaded_model=fake_loaded_model(), block_size=4, num_kv_blocks=64, device="cpu",
                   prefix_cache="none", scheduler_policy="prefill_first", kv_codec="unquantized")
    monkeypatch.setattr(nanocore, "LLM", fake_llm)
    monkeypatch.setattr(compile_check, "workload", lambda llm, rng: {"part": 0.0})
    monkeypatch.setattr(CompileRecorder, "install", lambda self: self)  # no global hook in the test process
    out = tmp_path / "check.json"
    assert compile_check.main(["--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["late_compiles"] == [] and result["workload_s"] == {"part": 0.0}
