"""The engine loop behind the server: continuous batching, aborts that free KV blocks, failures kept to one request."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import fake_llm, running_server, tiny_llm  # noqa: E402
from nanocore.engine.detokenizer import PROMPT_CONTEXT_TOKENS, IncrementalDetokenizer  # noqa: E402


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_64_concurrent_streams_share_steps_and_get_every_token():
    import openai

    llm = tiny_llm(num_kv_blocks=512)
    with running_server(llm, served_model_name="tiny") as (url, _):
        async def one(client, i: int):
            stream = await client.completions.create(
                model="tiny", prompt=[1 + i % 50, 7, 9, i % 13], max_tokens=8 + i % 24, temperature=0.8, seed=i,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            finishes, usage = [], None
            async for chunk in stream:
                finishes += [c.finish_reason for c in chunk.choices]
                usage = chunk.usage or usage
            return finishes, usage

        async def all_clients():
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            async with client:
                return await asyncio.gather(*(one(client, i) for i in range(64)))

        results = asyncio.run(all_clients())
    for i, (finishes, usage) in enumerate(results):
        assert usage.completion_tokens == 8 + i % 24 and usage.prompt_tokens == 4
        assert finishes[-1] == "length" and finishes.count("length") == 1
    total = sum(8 + i % 24 for i in range(64))
    stats = llm.stats()
    assert stats.num_generated_tokens == total
    assert stats.num_steps < total / 8  # continuous batching: many requests in every step


def test_client_disconnect_aborts_and_frees_kv_blocks():
    llm = tiny_llm(num_kv_blocks=256)
    block_manager = llm.engine.block_manager
    with running_server(llm) as (url, app):
        client = app.state.serve.client
        body = {"prompt": [3] * 40, "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
            assert block_manager.num_free_blocks < block_manager.num_blocks
        assert wait_until(lambda: block_manager.num_free_blocks == block_manager.num_blocks)
        assert not llm.engine.has_unfinished_requests() and client.num_waiting == 0
        assert llm.stats().num_generated_tokens < 3000  # aborted, not run to the end

        # a non-streaming request whose client gives up is aborted too
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=0.5)
        assert wait_until(lambda: block_manager.num_free_blocks == block_manager.num_blocks)
        assert not llm.engine.has_unfinished_requests()


def test_a_failing_detokenizer_fails_only_its_request(monkeypatch):
    add_tokens = IncrementalDetokenizer.add_tokens

    def explode_on_z(self, token_ids):
        if "Z" in self.tokenizer.decode(self.token_ids[:PROMPT_CONTEXT_TOKENS]):  # the prompt's last characters
            raise RuntimeError("planted detokenizer failure")
        return add_tokens(self, token_ids)

    monkeypatch.setattr(IncrementalDetokenizer, "add_tokens", explode_on_z)
    llm = fake_llm()
    with running_server(llm) as (url, _):
        async def send_all():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                # a stop string gives whole-body requests a detokenizer too (it checks the text every step)
                bodies = [{"prompt": f"hello {c}", "max_tokens": 12, "ignore_eos": True, "stream": s, "stop": "#"}
                          for c in "aZb" for s in (False, True)]
                return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

        plain_a, stream_a, plain_z, stream_z, plain_b, stream_b = asyncio.run(send_all())
        for ok in (plain_a, plain_b):
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 12
        for ok in (stream_a, stream_b):
            assert ok.status_code == 200 and "[DONE]" in ok.text and '"error"' not in ok.text
        assert plain_z.status_code == 500 and "planted detokenizer failure" in plain_z.json()["error"]["message"]
        assert '"error"' in stream_z.text and "planted detokenizer failure" in stream_z.text
        assert wait_until(lambda: not llm.engine.has_unfinished_requests())
        assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_a_failing_step_fails_the_running_requests_only_and_the_loop_goes_on(monkeypatch):
    """A KV cache of one block: the request running when a step raises fails, the one queued behind it runs."""
    llm = tiny_llm(num_kv_blocks=1)
    launch = llm.engine.runner.launch
    calls = {"n": 0}

    def fail_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("planted sampling failure")
        return launch(*args, **kwargs)

    monkeypatch.setattr(llm.engine.runner, "launch", fail_once)
    with running_server(llm) as (url, app):
        async def two_at_once():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                body = {"prompt": [4, 5, 6], "max_tokens": 10, "ignore_eos": True}
                return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(2)))

        responses = sorted(asyncio.run(two_at_once()), key=lambda r: r.status_code)
        assert [r.status_code for r in responses] == [200, 500]
        assert responses[0].json()["usage"]["completion_tokens"] == 10
        assert "planted sampling failure" in responses[1].json()["error"]["message"]
        later = httpx.post(f"{url}/v1/completions", json={"prompt": [1], "max_tokens": 3}, timeout=60)
        assert later.status_code == 200 and app.state.serve.client.is_alive
        assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_a_dead_engine_loop_answers_503_instead_of_hanging(monkeypatch):
    llm = tiny_llm()
    with running_server(llm) as (url, app):
        client = app.state.serve.client

        def broken_step():
            raise SystemError("planted bug in the loop")

        monkeypatch.setattr(client.transport, "_step", broken_step)
        response = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 4}, timeout=30)
        assert response.status_code == 503 and "shut down" in response.json()["error"]["message"]
        assert wait_until(lambda: not client.is_alive)
        assert httpx.get(f"{url}/health").status_code == 503
        again = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 4}, timeout=30)
        assert again.status_code == 503


def test_stream_interval_sends_fewer_larger_chunks():
    with running_server(tiny_llm(), stream_interval=4) as (url, _):
        body = {"prompt": [1, 2], "max_tokens": 10, "ignore_eos": True, "stream": True, "n": 2}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    for index in (0, 1):
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["index"] == index]
        # at most tokens 1, 2-5, 6-9, 10 (a reader that falls behind gets updates merged: fewer chunks, never more)
        assert 1 <= len(finishes) <= 4 and finishes[-1] == "length" and set(finishes[:-1]) <= {None}, finishes


def test_metrics_after_traffic():
    llm = tiny_llm()
    with running_server(llm) as (url, _):
        httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 6, "ignore_eos": True,
                                                  "n": 2}, timeout=60)
        text = httpx.get(f"{url}/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_hit_rate",
                 "num_preemptions_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket"):
        assert f"nanocore:{name}" in text
    assert "nanocore:generation_tokens_total 12.0" in text and "nanocore:prompt_tokens_total 8.0" in text
    assert 'nanocore:request_success_total{finished_reason="length"} 2.0' in text
    assert "nanocore:time_to_first_token_seconds_count 1.0" in text
