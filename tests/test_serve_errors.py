"""Bad input gets an OpenAI-shaped error with the right status, and the server keeps serving."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import running_server, tiny_llm  # noqa: E402

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "tiny"


@pytest.fixture(scope="module")
def url():
    with running_server(tiny_llm(max_model_len=256), served_model_name=MODEL, api_key=KEY) as (base, _):
        yield base


def post(url: str, path: str, body=None, headers=AUTH, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60, **kwargs)


def assert_error(response: httpx.Response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    return error


def completion(**fields):
    return {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, **fields}


def test_api_key_required_on_v1_routes(url):
    assert_error(post(url, "/v1/completions", completion(), headers={}), 401, "API key")
    assert_error(post(url, "/v1/completions", completion(), headers={"Authorization": "Bearer wrong"}), 401)
    assert_error(httpx.get(f"{url}/v1/models"), 401)
    assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL
    assert httpx.get(f"{url}/health").status_code == 200  # probes need no key


def test_unknown_model_is_404(url):
    error = assert_error(post(url, "/v1/completions", completion(model="gpt-4")), 404, "gpt-4", MODEL)
    assert error["code"] == "model_not_found" and error["param"] == "model"


@pytest.mark.parametrize("fields, words", [
    ({"max_tokens": -1}, ["max_tokens"]),
    ({"temperature": -0.5}, ["temperature"]),
    ({"temperature": "hot"}, ["temperature"]),
    ({"n": 10_000}, ["n = 10000", "max_num_seqs"]),
    ({"top_p": 0}, ["top_p"]),
    ({"prompt": list(range(300))}, ["300 tokens", "maximum context length is 256"]),
    ({"prompt": list(range(250)), "max_tokens": 10}, ["260 were requested", "250 in the prompt", "10 in the"]),
    ({"prompt": [1, 2, 99_999]}, ["token ids"]),
    ({"prompt": "text"}, ["no tokenizer"]),
    ({"prompt": []}, ["prompt"]),
    ({"prompt_logprobs": 21}, ["prompt_logprobs", "[0, 20]"]),
    ({"prompt_logprobs": 1, "stream": True}, ["prompt_logprobs", "stream"]),
    ({"logprobs": 50}, ["logprobs"]),
    ({"stop": "x"}, ["stop strings", "tokenizer"]),
])
def test_bad_completion_fields_are_400(url, fields, words):
    assert_error(post(url, "/v1/completions", completion(**fields)), 400, *words)


def test_bad_json_and_missing_fields_are_400(url):
    broken = httpx.post(f"{url}/v1/completions", content=b'{"model": "tiny", "prompt": [1,', timeout=30,
                        headers={**AUTH, "Content-Type": "application/json"})
    assert_error(broken, 400, "JSON")
    assert_error(post(url, "/v1/completions", {"model": MODEL}), 400, "prompt")
    assert_error(post(url, "/v1/chat/completions", {"model": MODEL, "messages": []}), 400, "messages")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert_error(post(url, "/v1/chat/completions", chat), 400, "chat template")  # dummy weights: no tokenizer


def test_unknown_route_is_an_openai_error(url):
    assert_error(httpx.get(f"{url}/v1/nothing-here"), 404)


def test_still_serving_after_bad_requests(url):
    response = post(url, "/v1/completions", completion(max_tokens=5, ignore_eos=True))
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 5


def test_too_many_waiting_requests_is_429():
    """One sequence runs at a time and two may wait: of eight simultaneous long requests some are refused."""
    with running_server(tiny_llm(max_num_seqs=1), max_waiting_requests=2) as (url, _):
        async def send_all():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                body = {"prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": True}
                return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(8)))

        responses = asyncio.run(send_all())
        statuses = sorted(r.status_code for r in responses)
        assert 429 in statuses and 200 in statuses and set(statuses) <= {200, 429}
        refused = next(r for r in responses if r.status_code == 429)
        assert_error(refused, 429, "waiting requests")
        done = [r.json() for r in responses if r.status_code == 200]
        assert all(d["usage"]["completion_tokens"] == 64 for d in done)
