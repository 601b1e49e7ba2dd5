"""`nanocore serve` with the engine in its own process (--engine-process): same answers as the in-process loop,
aborts free KV blocks in the child, errors cross the pipe with their HTTP status, a dead child fails cleanly."""
from __future__ import annotations

import concurrent.futures
import re
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import TINY, openai_client, tiny_llm  # noqa: E402

from nanocore.cli.serve_cmd import use_engine_process  # noqa: E402
from nanocore.config import EngineConfig  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.serve.engine_process import decode_error, encode_error  # noqa: E402
from nanocore.serve.protocol import APIError  # noqa: E402
from nanocore.serve.server import ServerThread, create_process_app  # noqa: E402

MODEL = "dummy:tiny-qwen2"
PROMPTS = [[5, 17, 101, 3, 250], [9, 9, 400, 2], [77] * 12]


def tiny_config(**fields) -> EngineConfig:
    return EngineConfig(model=MODEL, **{**TINY, **fields})


@pytest.fixture(scope="module")
def server():
    app = create_process_app(tiny_config(), max_waiting_requests=64)
    with ServerThread(app) as url:
        yield url, app
    assert not app.state.serve.client.is_alive  # shutdown stopped the child


def kv_usage(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return float(re.search(r"^nanocore:kv_cache_usage_perc (\S+)$", text, re.M).group(1))


def test_greedy_tokens_equal_the_offline_engine(server):
    url, _ = server
    client = openai_client(url)
    expected = tiny_llm().generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                                   use_tqdm=False)
    for prompt, want in zip(PROMPTS, expected):
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=0,
                                        extra_body={"ignore_eos": True})
        assert got.choices[0].logprobs.tokens == [f"token_id:{t}" for t in want.outputs[0].token_ids]
        assert got.usage.completion_tokens == 10 and got.usage.prompt_tokens == len(prompt)


def test_a_list_of_prompts_is_one_batch_through_the_pipe(server):
    url, _ = server
    client = openai_client(url)
    args = dict(model=MODEL, max_tokens=5, temperature=0, logprobs=0, extra_body={"ignore_eos": True})
    batch = client.completions.create(prompt=PROMPTS, **args)
    alone = [client.completions.create(prompt=p, **args).choices[0].logprobs.tokens for p in PROMPTS]
    assert [c.logprobs.tokens for c in sorted(batch.choices, key=lambda c: c.index)] == alone
    refused = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": [[1, 2], [1, 99_999]],
                                                        "max_tokens": 2}, timeout=30)
    assert refused.status_code == 400 and "prompt 1" in refused.json()["error"]["message"]
    assert kv_usage(url) == 0  # the first prompt of the refused batch was not left behind


def test_concurrent_streams_finish_with_their_token_counts(server):
    url, _ = server
    client = openai_client(url)

    def stream(i: int) -> int:
        chunks = client.completions.create(model=MODEL, prompt=[i + 1, 2, 3], max_tokens=5 + i % 7, temperature=0.8,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        return [c.usage.completion_tokens for c in chunks if c.usage][0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        counts = list(pool.map(stream, range(32)))
    assert counts == [5 + i % 7 for i in range(32)]


def test_a_client_that_disconnects_frees_its_blocks_in_the_child(server):
    url, _ = server
    body = {"model": MODEL, "prompt": [3] * 40, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()  # kept open: closing the iterator closes the connection
        next(line for line in lines if line.startswith("data: {"))  # one chunk in: it runs and holds blocks
        assert kv_usage(url) > 0
    deadline = time.monotonic() + 30
    while kv_usage(url) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kv_usage(url) == 0


def test_errors_cross_the_pipe_with_their_status(server):
    url, _ = server
    too_long = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": [1] * 5000, "max_tokens": 4})
    assert too_long.status_code == 400 and "max_model_len" in too_long.json()["error"]["message"]
    unknown = httpx.post(f"{url}/v1/completions", json={"model": "other", "prompt": [1], "max_tokens": 4})
    assert unknown.status_code == 404
    version = httpx.get(f"{url}/version").json()
    assert version["backends"]["prefix_cache"] == "none" and version["vocab_size"] == 512


def test_error_encoding_round_trip():
    api = decode_error(encode_error(APIError(503, "busy", type="server_error", code="service_unavailable")))
    assert isinstance(api, APIError) and (api.status, api.message, api.code) == (503, "busy", "service_unavailable")
    assert isinstance(decode_error(encode_error(ValueError("bad prompt"))), ValueError)
    assert "KeyError" in str(decode_error(encode_error(KeyError("x"))))
    assert decode_error(encode_error(None)) is None


def test_a_dead_engine_process_fails_requests_in_flight_and_health():
    app = create_process_app(tiny_config(), max_waiting_requests=8)
    client = app.state.serve.client
    with ServerThread(app) as url:
        body = {"model": MODEL, "prompt": [4] * 10, "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            client.transport.process.kill()
            rest = "\n".join(lines)
        assert "engine stopped" in rest and "[DONE]" in rest
        assert httpx.get(f"{url}/health").status_code == 503
        refused = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": [1], "max_tokens": 2})
        assert refused.status_code == 503


def test_a_child_that_cannot_start_is_a_clear_error():
    with pytest.raises(RuntimeError, match="engine process failed to start: .*Qwen9"):
        create_process_app(EngineConfig(model="dummy:Qwen9-1B", device="cpu"))


def test_engine_process_auto_is_on_for_gpus_only():
    assert use_engine_process("on", "cpu") and not use_engine_process("off", "cuda")
    assert use_engine_process("auto", "cuda:1") and not use_engine_process("auto", "cpu")


def test_tensor_parallel_engine_process_serves():
    """The engine child starts its own tensor-parallel worker (a daemonic child could not)."""
    app = create_process_app(tiny_config(tensor_parallel_size=2, num_kv_blocks=64))
    with ServerThread(app) as url:
        got = openai_client(url).completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0,
                                                    logprobs=0, extra_body={"ignore_eos": True})
    expected = tiny_llm(tensor_parallel_size=2, num_kv_blocks=64).generate(
        [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert got.choices[0].logprobs.tokens == [f"token_id:{t}" for t in expected[0].outputs[0].token_ids]
    assert not app.state.serve.client.is_alive


EXIT_WITHOUT_CLOSE = """
import os, sys
from nanocore.config import EngineConfig
from nanocore.serve.engine_process import ProcessTransport
if __name__ == "__main__":
    transport = ProcessTransport(EngineConfig(model="dummy:tiny-qwen2", device="cpu", num_kv_blocks=32))
    print(transport.process.pid, flush=True)
"""


def test_the_engine_child_stops_when_its_parent_exits_without_closing(tmp_path):
    import subprocess

    from spawn_helpers import wait_until_gone

    script = tmp_path / "leave.py"
    script.write_text(EXIT_WITHOUT_CLOSE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert wait_until_gone(int(done.stdout.split()[-1]), timeout_s=30)
