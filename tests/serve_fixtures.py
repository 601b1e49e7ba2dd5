"""Servers for the serve tests: an in-process uvicorn thread on a free port around a small LLM."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import fake_loaded_model  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.serve.server import ServerThread, create_app  # noqa: E402

TINY = dict(device="cpu", num_kv_blocks=128, block_size=16, prefix_cache="none", scheduler_policy="prefill_first")


def tiny_llm(**fields) -> LLM:
    """Random weights at tiny Qwen2 shapes (vocab 512, no tokenizer): prompts are token ids."""
    return LLM("dummy:tiny-qwen2", **{**TINY, **fields})


def fake_llm(**fields) -> LLM:
    """The engine tests' fake model with a character tokenizer (text in, text out, no checkpoint)."""
    return LLM("fake", loaded_model=fake_loaded_model(), **{**TINY, "block_size": 4, **fields})


@contextlib.contextmanager
def running_server(llm: LLM, **app_options):
    """(base url, app) of a server over ``llm``; stopped (engine loop joined) on exit."""
    app = create_app(llm, **app_options)
    with ServerThread(app) as url:
        yield url, app


def openai_client(url: str, api_key: str = "unused", **kwargs):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60, **kwargs)
