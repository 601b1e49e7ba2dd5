"""Data parallel on Ray Serve: a local Ray cluster (CPU), 2 engine replicas of a tiny random model with a
byte-level tokenizer and a chat template, served to the real `openai` client through nanocore.ray.

Ray is installed by requirements.txt (the ray extra): without it these tests fail, they are not skipped.
Select them with ``-m ray``; they share one cluster and one application (about a minute on 2 cores).
"""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint  # noqa: E402
from serve_fixtures import openai_client  # noqa: E402

from nanocore.config import EngineConfig  # noqa: E402

pytestmark = pytest.mark.ray
START_TIMEOUT_S = 150  # the cluster and 3 replicas (each imports torch and loads the model) on a busy 2-core machine
TEST_TIMEOUT_S = 90
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(autouse=True)
def time_limit():
    """Each test fails (instead of hanging the suite) after TEST_TIMEOUT_S."""
    with alarm(TEST_TIMEOUT_S):
        yield


class alarm:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        def expire(signum, frame):
            raise TimeoutError(f"gave up after {self.seconds} s")
        self.previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


def tiny_chat_checkpoint(path: Path) -> Path:
    """A random Qwen2 (vocab 260) with a byte-level tokenizer (one token per byte) and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                        additional_special_tokens=SPECIAL, chat_template=CHAT_TEMPLATE)
    assert len(tokenizer) <= 260
    make_checkpoint(path, "qwen2", vocab_size=260, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(base url, served model name) of one application: 2 engine replicas, half a CPU each."""
    import ray
    from ray import serve

    from nanocore.ray.app import APP_NAME, ReplicaOptions, build_application
    from nanocore.serve.server import free_port

    model = tiny_chat_checkpoint(tmp_path_factory.mktemp("ray-model"))
    config = EngineConfig(model=str(model), device="cpu", num_kv_blocks=64, block_size=16, max_num_seqs=8,
                          prefix_cache="hash", scheduler_policy="prefill_first")
    options = ReplicaOptions(num_replicas=2, num_cpus=0.5, ingress_num_cpus=0.5, health_check_period_s=1.0,
                             health_check_timeout_s=20.0, affinity_tokens=16)
    server = {"served_model_name": "tiny", "api_key": None, "max_waiting_requests": 64, "drain_timeout_s": 1.0,
              "max_body_mib": 1.0, "stream_interval": 1}
    port = free_port()
    with alarm(START_TIMEOUT_S):
        ray.init(num_cpus=4, include_dashboard=False, logging_level="warning", log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_application(config, options, server), name=APP_NAME, route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}", "tiny"
    finally:
        serve.shutdown()
        ray.shutdown()


def complete(client, model: str, prompt: str, max_tokens: int = 2):
    """(response, id of the replica that served it)."""
    raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                      temperature=0)
    return raw.parse(), raw.headers.get("x-nanocore-replica")


def test_completions_and_chat_with_the_openai_client(app):
    url, model = app
    client = openai_client(url)
    prompt = "The capital of France is"
    response, replica = complete(client, model, prompt, max_tokens=4)
    assert replica and response.model == model and response.choices[0].finish_reason in ("length", "stop")
    assert response.usage.prompt_tokens == len(prompt)  # one token per byte
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == response.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == response.usage.completion_tokens
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    expected = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=30).json()["count"]
    assert chat.usage.prompt_tokens == expected and 1 <= chat.usage.completion_tokens <= 4


def test_distinct_prompts_spread_over_both_replicas(app):
    url, model = app
    client = openai_client(url)
    served = [complete(client, model, f"{i} distinct prompt number {i}", max_tokens=1)[1] for i in range(16)]
    assert len(set(served)) == 2, served  # each prompt's preferred replica is a hash: 16 never all on one (2^-15)


def test_shared_prefix_goes_to_one_replica(app):
    url, model = app
    client = openai_client(url)
    prefix = "You are a helpful assistant. Answer briefly. "  # longer than affinity_tokens (16)
    served = [complete(client, model, f"{prefix}question {i}?", max_tokens=2)[1] for i in range(6)]
    assert len(set(served)) == 1, served


def test_killed_replica_is_replaced_and_requests_keep_being_served(app):
    import ray

    url, model = app
    client = openai_client(url)
    prefix = "Requests of this prefix prefer the replica we kill. "
    victim = complete(client, model, prefix, max_tokens=1)[1]
    survivor = set(alive_replica_ids()) - {victim}
    ray.kill(replica_actor(victim), no_restart=True)
    for i in range(4):  # right after the kill the router may still pick the dead replica: the batch is resent
        response, replica = complete(client, model, f"{prefix}{i}", max_tokens=2)
        assert replica != victim and response.choices[0].text is not None
    while True:  # the controller made a replacement and it runs (the alarm bounds the wait)
        replicas = set(alive_replica_ids())
        if victim not in replicas and len(replicas) == 2 and engine_replica_states() == {"RUNNING": 2}:
            break
        time.sleep(0.5)
    assert len(survivor) == 1 and len(replicas - survivor) == 1, (victim, survivor, replicas)
    served = {complete(client, model, f"{i} after the restart {i}", max_tokens=1)[1] for i in range(16)}
    assert served == replicas, served  # the replacement serves too


def engine_replica_states() -> dict[str, int]:
    from ray import serve

    from nanocore.ray.app import APP_NAME, ENGINE_DEPLOYMENT

    return dict(serve.status().applications[APP_NAME].deployments[ENGINE_DEPLOYMENT].replica_states)


def alive_replica_ids() -> list[str]:
    import ray

    from nanocore.ray.app import APP_NAME, ENGINE_DEPLOYMENT

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [name.rsplit("#", 1)[1] for name in names if f"{APP_NAME}#{ENGINE_DEPLOYMENT}#" in name]


def replica_actor(replica_id: str):
    import ray

    from nanocore.ray.app import APP_NAME, ENGINE_DEPLOYMENT

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].endswith(f"{APP_NAME}#{ENGINE_DEPLOYMENT}#{replica_id}"):
            return ray.get_actor(actor["name"], namespace=actor["namespace"])
    raise AssertionError(f"no actor for replica {replica_id}")
