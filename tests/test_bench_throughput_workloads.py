"""bench throughput: workload presets (kv-bound), output ranges, and the KV report (preemptions, peaks, capacity)."""
from __future__ import annotations

import argparse
import json

import pytest

from nanocore.bench.throughput import WORKLOADS, make_workload, run_throughput
from nanocore.cli.bench_cmd import add_throughput_args, throughput_workload
from nanocore.cli.common import add_engine_args
from nanocore.cli.main import main


def parse(argv):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    add_throughput_args(parser)
    return parser.parse_args(argv)


def test_kv_bound_preset_numbers_and_overrides():
    batch, engine = throughput_workload(parse(["--workload", "kv-bound"]))
    assert batch == {"num_seqs": 512, "min_len": 1024, "max_len": 2048, "output_lens": (512, 1024)}
    assert engine == {"max_num_seqs": 512, "max_model_len": 4096}
    batch, engine = throughput_workload(parse(["--workload", "kv-bound", "--num-seqs", "3", "--max-output-len", "600",
                                               "--max-num-seqs", "64"]))
    assert batch["num_seqs"] == 3 and batch["output_lens"] == (512, 600)
    assert engine == {"max_model_len": 4096}  # a flag the user gave is never overridden
    default, engine = throughput_workload(parse(["--min-len", "50", "--max-len", "60"]))
    assert default == {"num_seqs": 256, "min_len": 50, "max_len": 60, "output_lens": (50, 60)} and engine == {}


def test_output_lengths_have_their_own_range_and_the_default_draws_are_unchanged():
    pairs = make_workload(50, 1024, 2048, 32000, seed=0, output_lens=(512, 1024))
    assert all(1024 <= len(p) <= 2048 and 512 <= n <= 1024 for p, n in pairs)
    assert make_workload(5, 10, 20, 100, 1) == make_workload(5, 10, 20, 100, 1, output_lens=(10, 20))
    assert sum(n for _, n in make_workload(*(WORKLOADS["nano-vllm"].num_seqs, 100, 1024, 151936))) == 133966
    with pytest.raises(ValueError, match="min_output_len <= max_output_len"):
        make_workload(2, 4, 8, 100, output_lens=(9, 3))
    with pytest.raises(ValueError, match="at least one sequence"):
        make_workload(0, 4, 8, 100)


def test_kv_report_on_a_cache_too_small_for_the_batch():
    """8 sequences of up to 48 tokens in 24 blocks of 4 (96 tokens): preemptions, a full cache, few running."""
    from nanocore import LLM
    llm = LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=24, block_size=4)
    result = run_throughput(llm, 8, 16, 24, output_lens=(16, 24), warmup="none")
    vocab = llm.engine.loaded.hf_config.vocab_size
    assert result.output_tokens == sum(n for _, n in make_workload(8, 16, 24, vocab, 0, (16, 24)))
    assert result.preemptions > 0 and 1 <= result.peak_running_seqs < 8
    assert 0.8 <= result.peak_kv_usage <= 1.0 and result.kv_capacity_tokens == 96
    roomy = LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=256, block_size=4)
    result = run_throughput(roomy, 8, 16, 24, output_lens=(16, 24), warmup="one")
    assert result.preemptions == 0 and result.peak_running_seqs == 8  # peaks restart after the warm-up
    assert 0 < result.peak_kv_usage < 0.5 and result.kv_capacity_tokens == 1024


def test_kv_bound_engine_fields_yield_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCORE_MAX_NUM_SEQS", "7")
    out = tmp_path / "kv.json"
    assert main(["bench", "throughput", "--workload", "kv-bound", "--model", "dummy:tiny-qwen2", "--device", "cpu",
                 "--num-seqs", "2", "--min-len", "4", "--max-len", "6", "--min-output-len", "2",
                 "--max-output-len", "3", "--num-kv-blocks", "32", "--warmup", "none", "--json", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["max_num_seqs"] == 7 and config["max_model_len"] == 4096


def test_cli_kv_bound_writes_the_kv_report(tmp_path, capsys):
    out = tmp_path / "kv.json"
    code = main(["bench", "throughput", "--workload", "kv-bound", "--model", "dummy:tiny-qwen2", "--device", "cpu",
                 "--num-seqs", "3", "--min-len", "8", "--max-len", "12", "--min-output-len", "4",
                 "--max-output-len", "6", "--num-kv-blocks", "64", "--warmup", "none", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "peak_running_seqs" in table and "peak_kv_usage" in table and "kv_capacity_tokens" in table
    data = json.loads(out.read_text())
    assert data["workload"]["name"] == "kv-bound"
    assert (data["workload"]["min_output_len"], data["workload"]["max_output_len"]) == (4, 6)
    assert data["config"]["max_num_seqs"] == 512 and data["config"]["max_model_len"] == 4096
    result = data["result"]
    assert result["peak_running_seqs"] == 3 and result["preemptions"] == 0
    assert 0 < result["peak_kv_usage"] <= 1 and result["kv_capacity_tokens"] == data["kv_capacity_tokens"]
