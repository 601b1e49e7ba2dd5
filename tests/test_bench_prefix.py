"""``nanocore bench prefix`` on CPU: scenarios' prompts, hit rates, identical outputs with and without the cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import VOCAB, fake_loaded_model
from nanocore.bench.prefix import PrefixWorkload, make_prompts, run_all, scenario_list, summary_rows
from nanocore.engine.llm import LLM
from nanocore.plugins import get_registry

SMALL = PrefixWorkload(num_requests=4, prefix_len=32, suffix_len=8, output_len=4, repeats=2)


def test_scenario_prompts():
    for scenario in ("no-reuse", "shared-prefix", "partial-shared"):
        warmup, prompts = make_prompts(scenario, SMALL, 1000)
        assert len(prompts) == 4 and {len(p) for p in [warmup, *prompts]} == {40}
        assert make_prompts(scenario, SMALL, 1000) == (warmup, prompts)  # deterministic
        assert make_prompts(scenario, SMALL, 1000, repeat=1)[0] != warmup  # fresh prompts each repeat
    warmup, prompts = make_prompts("shared-prefix", SMALL, 1000)
    assert all(p[:32] == warmup[:32] and p[32:] != warmup[32:] for p in prompts)
    warmup, prompts = make_prompts("partial-shared", SMALL, 1000)
    assert [p[:k] == warmup[:k] and p[k] != warmup[k] for p, k in zip(prompts[:3], (8, 16, 24))] == [True] * 3
    assert prompts[3][:32] == warmup[:32]
    warmup, prompts = make_prompts("no-reuse", SMALL, 1000)
    assert all(p[:4] != warmup[:4] for p in prompts)
    with pytest.raises(ValueError, match="choose from"):
        make_prompts("everything", SMALL, 1000)
    with pytest.raises(ValueError, match="choose from"):
        scenario_list("shared")
    assert scenario_list("all") == ["no-reuse", "shared-prefix", "partial-shared"]


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_hit_rates_and_identical_outputs_on_a_fake_model(cache):
    if cache not in get_registry().names("prefix_cache"):
        pytest.skip(f"prefix cache plugin {cache!r} is not installed")
    fields = {"device": "cpu", "block_size": 4, "num_kv_blocks": 256, "kv_codec": "unquantized"}
    scenarios = ["no-reuse", "shared-prefix", "partial-shared"]
    vocab = len(VOCAB)
    cached = run_all(LLM("fake", loaded_model=fake_loaded_model(), prefix_cache=cache, **fields), scenarios, SMALL, vocab)
    plain = run_all(LLM("fake", loaded_model=fake_loaded_model(), prefix_cache="none", **fields), scenarios, SMALL, vocab)
    prompt_tokens = 2 * 4 * 40
    assert cached["no-reuse"].cached_tokens == 0 and cached["no-reuse"].hit_rate == 0
    assert cached["shared-prefix"].cached_tokens == 2 * 4 * 32  # the whole prefix, block aligned
    assert cached["shared-prefix"].hit_rate == pytest.approx(32 / 40)
    assert cached["partial-shared"].cached_tokens == 2 * (8 + 16 + 24 + 32)
    assert all(r.prompt_tokens == prompt_tokens for r in cached.values())
    assert all(r.cached_tokens == 0 for r in plain.values())
    rows = summary_rows(cached, plain)
    assert [r["identical"] for r in rows] == [True] * 3 and rows[1]["identical_requests"] == 8
    assert all(len(r.outputs) == 8 and all(len(o) == 4 for o in r.outputs) for r in cached.values())


def test_bench_prefix_cli_on_a_tiny_checkpoint(tmp_path):
    from model_fixtures import make_checkpoint
    ckpt = make_checkpoint(tmp_path / "tiny", "llama")
    out = tmp_path / "prefix.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "nanocore.cli.main", "bench", "prefix", "--model", str(ckpt), "--device", "cpu",
         "--prefix-len", "32", "--suffix-len", "8", "--output-len", "3", "--num-requests", "4", "--block-size", "8",
         "--num-kv-blocks", "64", "--prefix-cache", "radix", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "shared-prefix_vs_no_reuse" in result.stdout
    data = json.loads(out.read_text())
    rows = {r["scenario"]: r for r in data["rows"]}
    assert rows["no-reuse"]["hit_rate"] == 0 and rows["shared-prefix"]["hit_rate"] == pytest.approx(32 / 40)
    assert 0 < rows["partial-shared"]["hit_rate"] < rows["shared-prefix"]["hit_rate"]
    assert data["identical"] is True and all(r["prefix_cache"] == "radix" for r in data["rows"])
    assert data["workload"]["prefix_len"] == 32 and "git_commit" in data["environment"]
