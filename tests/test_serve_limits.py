"""Errors as OpenAI and vLLM give them, through the real `openai` client: the context, fields nanocore does not
implement, the body limit, stop strings, models/{id}, tokenize / detokenize, the OpenAPI schema."""
from __future__ import annotations

import concurrent.futures
import gc
import json
import logging
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import fake_llm, openai_client, running_server, tiny_llm  # noqa: E402

from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.serve.protocol import MAX_STOP_STRINGS  # noqa: E402

MODEL = "tiny"


@pytest.fixture(scope="module")
def tiny():
    """(url, client, llm): random weights, prompts as token ids, max_model_len 256, a 16 KiB body limit."""
    llm = tiny_llm(max_model_len=256)
    with running_server(llm, served_model_name=MODEL, max_body_mib=1 / 64) as (url, _):
        yield url, openai_client(url), llm


@pytest.fixture(scope="module")
def chars():
    """(url, client): the fake model's character tokenizer (text in, text out)."""
    with running_server(fake_llm(), served_model_name=MODEL) as (url, _):
        yield url, openai_client(url)


def bad_request(call, *words: str, param: str | None = None) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.body
    for word in words:
        assert word in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def test_max_tokens_past_the_context_is_400_with_the_numbers(tiny):
    _, client, _ = tiny
    bad_request(lambda: client.completions.create(model=MODEL, prompt=[1] * 200, max_tokens=100),
                "maximum context length is 256", "300 were requested", "200 in the prompt", "100 in the completion",
                param="max_tokens")
    ok = client.completions.create(model=MODEL, prompt=[1] * 200, max_tokens=56, extra_body={"ignore_eos": True})
    assert ok.usage.completion_tokens == 56  # exactly the context: served in full


@pytest.mark.parametrize("fields, name", [
    ({"best_of": 2}, "best_of"),
    ({"extra_body": {"tools": [{"type": "function", "function": {"name": "f"}}]}}, "tools"),
    ({"extra_body": {"guided_decoding_backend": "xgrammar"}}, "guided_decoding_backend"),
    ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
])
def test_a_field_that_would_change_the_output_is_400_naming_it(tiny, fields, name):
    _, client, _ = tiny
    bad_request(lambda: client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2, **fields),
                name, "not supported", param=name)


def test_chat_fields_that_would_change_the_output_are_400(tiny):
    _, client, _ = tiny
    messages = [{"role": "user", "content": "hi"}]
    for fields, name in [({"modalities": ["text", "audio"]}, "modalities"),
                         ({"extra_body": {"audio": {"voice": "alloy", "format": "wav"}}}, "audio"),
                         ({"extra_body": {"functions": [{"name": "f"}]}}, "functions"),
                         ({"extra_body": {"prediction": {"type": "content", "content": "x"}}}, "prediction"),
                         ({"extra_body": {"echo": True}}, "echo")]:
        bad_request(lambda: client.chat.completions.create(model=MODEL, messages=messages, **fields), name,
                    param=name)


def test_neutral_values_and_fields_without_effect_are_accepted_and_unknown_ones_warned_once(tiny, caplog):
    _, client, _ = tiny
    caplog.set_level(logging.WARNING, logger="nanocore.serve")
    for _ in range(2):
        ok = client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2, user="u1", best_of=1,
                                       extra_body={"metadata": {"k": "v"}, "store": False, "ignore_eos": True,
                                                   "response_format": {"type": "text"}, "my_own_field": 3})
        assert ok.usage.completion_tokens == 2
    warned = [r for r in caplog.records if "my_own_field" in r.getMessage()]
    assert len(warned) == 1 and not any("metadata" in r.getMessage() for r in caplog.records)


def test_stop_strings_have_a_cap(chars):
    _, client = chars
    many = [f"#{i}" for i in range(MAX_STOP_STRINGS + 1)]
    bad_request(lambda: client.completions.create(model=MODEL, prompt="hello", max_tokens=2, stop=many),
                f"at most {MAX_STOP_STRINGS}", param="stop")
    ok = client.completions.create(model=MODEL, prompt="hello", max_tokens=2, stop=many[:MAX_STOP_STRINGS])
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_a_lone_surrogate_is_400_and_named(chars):
    """JSON allows the escape \\ud800 (the openai client cannot send it: it encodes UTF-8 first)."""
    url, _ = chars

    def post(path: str, body: dict) -> dict:
        response = httpx.post(f"{url}{path}", content=json.dumps(body).encode(), timeout=30,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        return response.json()["error"]

    for path, body, param in [("/v1/completions", {"prompt": "Hi \ud800", "max_tokens": 2}, "prompt"),
                              ("/v1/completions", {"prompt": "Hi", "stop": ["\udc00"]}, "stop"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi \ud800"}]},
                               "messages"),
                              ("/tokenize", {"prompt": "\ud800"}, "prompt")]:
        error = post(path, body)
        assert "lone surrogate" in error["message"] and error["param"] == param and "template" not in error["message"]


def test_models_retrieve(tiny):
    _, client, _ = tiny
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.owned_by == "nanocore" and card.model_extra["max_model_len"] == 256
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_tokenize_detokenize_round_trip(chars):
    url, _ = chars
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": "hello world", "return_token_strs": True},
                        timeout=30).json()
    assert tokens["count"] == len(tokens["tokens"]) == len("hello world") and tokens["max_model_len"] == 512
    assert "".join(tokens["token_strs"]) == "hello world"
    text = httpx.post(f"{url}/detokenize", json={"tokens": tokens["tokens"]}, timeout=30).json()
    assert text == {"prompt": "hello world"}
    out_of_range = httpx.post(f"{url}/detokenize", json={"tokens": [10 ** 6]}, timeout=30)
    assert out_of_range.status_code == 400 and "token ids" in out_of_range.json()["error"]["message"]
    neither = httpx.post(f"{url}/tokenize", json={}, timeout=30)
    assert neither.status_code == 400


def test_a_body_over_the_limit_is_413_with_or_without_content_length(tiny):
    url, client, _ = tiny
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model=MODEL, prompt=[7] * 10_000, max_tokens=2)  # 20 KB of JSON
    assert caught.value.status_code == 413 and "limit of 16384 bytes" in caught.value.body["message"]

    def chunked():
        yield b'{"model": "tiny", "max_tokens": 2, "prompt": [7'
        for _ in range(2000):
            yield b", 7, 7, 7"
        yield b"]}"

    response = httpx.post(f"{url}/v1/completions", content=chunked(), timeout=30,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert client.completions.create(model=MODEL, prompt=[7] * 10, max_tokens=2).usage.completion_tokens <= 2


def test_a_list_of_prompts_runs_as_one_batch(tiny):
    """Twenty prompts in one request are added before one step: the engine runs about max_tokens steps for them,
    as for twenty concurrent requests, not one or more per prompt (each waiting for the one before it)."""
    _, client, llm = tiny
    prompts = [[i + 1, 2, 3] for i in range(20)]
    args = dict(model=MODEL, max_tokens=6, temperature=0, logprobs=0, extra_body={"ignore_eos": True})
    steps_before, start = llm.stats().num_steps, time.perf_counter()
    one = client.completions.create(prompt=prompts, **args)
    seconds, steps = time.perf_counter() - start, llm.stats().num_steps - steps_before
    assert sorted(c.index for c in one.choices) == list(range(20)) and one.usage.completion_tokens == 120
    assert steps <= 8, steps
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        start = time.perf_counter()
        each = list(pool.map(lambda p: client.completions.create(prompt=p, **args), prompts))
        concurrent_seconds = time.perf_counter() - start
    by_index = sorted(one.choices, key=lambda c: c.index)
    assert [c.logprobs.tokens for c in by_index] == [r.choices[0].logprobs.tokens for r in each]
    print(f"\n20 prompts: one request {seconds:.2f} s ({steps} engine steps), 20 concurrent requests "
          f"{concurrent_seconds:.2f} s")


def test_openapi_matches_the_answers(tiny):
    url, _, _ = tiny
    spec = httpx.get(f"{url}/openapi.json", timeout=30).json()
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            assert "422" not in operation["responses"], path
    completions = spec["paths"]["/v1/completions"]["post"]["responses"]
    assert {"400", "413", "429"} <= set(completions) and "text/event-stream" in completions["200"]["content"]
    assert list(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert "/v1/models/{model_id}" in spec["paths"] and "/tokenize" in spec["paths"]
    metrics = httpx.get(f"{url}/metrics", timeout=30)
    assert metrics.headers["content-type"].startswith("text/plain")
    invalid = httpx.post(f"{url}/v1/completions", json={"model": MODEL}, timeout=30)
    assert invalid.status_code == 400  # what the schema says, not 422


def test_a_client_disconnect_logs_no_traceback(caplog):
    # a context of 2,000 tokens: each request runs for seconds, so the client always leaves mid-request
    llm = tiny_llm(max_model_len=2048)
    caplog.set_level(logging.ERROR)
    body = {"model": MODEL, "prompt": [3] * 10, "max_tokens": 2000, "ignore_eos": True}
    with running_server(llm, served_model_name=MODEL) as (url, _):
        for _ in range(3):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/v1/completions", json=body, timeout=0.3)
        deadline = time.monotonic() + 30
        while llm.engine.has_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not llm.engine.has_unfinished_requests(), "a disconnected client's request kept running"
        time.sleep(0.2)
        gc.collect()  # an unretrieved future's error is logged when it is collected
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_offline_generate_clamps_max_tokens_and_says_so_once(caplog):
    llm = tiny_llm(max_model_len=64)
    caplog.set_level(logging.WARNING, logger="nanocore")
    params = SamplingParams(max_tokens=10 ** 6, ignore_eos=True)
    outputs = llm.generate([[1] * 10, [2] * 20], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [54, 44]
    said = [r.getMessage() for r in caplog.records if "max_model_len" in r.getMessage()]
    assert said == ["max_tokens 1000000 with a 10-token prompt is past max_model_len 64: at most 54 tokens are "
                    "generated (and 1 more requests)"]
