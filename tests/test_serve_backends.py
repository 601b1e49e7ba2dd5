"""Every installed KV codec, prefix cache and scheduler policy that runs here serves through `nanocore serve`,
and GET /version names the one in use (a server must never silently fall back to another backend)."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import fake_loaded_model  # noqa: E402
from serve_fixtures import TINY, running_server  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.plugins import get_registry  # noqa: E402

KINDS = ("kv_codec", "prefix_cache", "scheduler_policy")


def backends_here() -> list[tuple[str, str]]:
    return [(row["kind"], row["name"]) for row in get_registry().rows("cpu")
            if row["kind"] in KINDS and row["supported"]]


@pytest.mark.parametrize("kind, name", backends_here())
def test_server_reports_and_runs_the_chosen_backend(kind, name):
    loaded = fake_loaded_model(hidden=128, num_heads=4)  # head_dim 32: every scale group of the codecs fits
    llm = LLM("fake", loaded_model=loaded, **{**TINY, "block_size": 4, kind: name})
    with running_server(llm) as (url, _):
        assert httpx.get(f"{url}/version").json()["backends"][kind] == name
        body = {"prompt": [[7, 8, 9, 10] * 5] * 2, "max_tokens": 6, "ignore_eos": True, "temperature": 0}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    assert response["usage"]["completion_tokens"] == 12
    first, second = response["choices"]  # the same prompt twice, greedy (the second may hit the prefix cache)
    assert first["text"] == second["text"] and len(first["text"]) > 0
