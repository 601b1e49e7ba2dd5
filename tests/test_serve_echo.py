"""echo, max_tokens=0 and prompt_logprobs on /v1/completions through the real `openai` client (character-tokenizer
fake model: one token per character), checked against a full forward of the prompt."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import fake_llm, openai_client, running_server  # noqa: E402

PROMPT = "the cat sat on the mat"
MODEL = "fake"


@pytest.fixture(scope="module")
def served():
    """(openai client, base url, prompt ids, reference logprobs [P-1, vocab]) on a chunked-prefill server."""
    llm = fake_llm(max_num_batched_tokens=8, scheduler_policy="decode_first")
    ids = llm.engine.tokenize(PROMPT)
    reference = llm.engine.prompt_logits(ids).log_softmax(-1)[:-1]  # before the engine loop owns the engine
    with running_server(llm, served_model_name=MODEL) as (url, _):
        yield openai_client(url), url, ids, reference


def check_prompt_part(logprobs, ids, reference, top_n: int) -> None:
    """The first len(ids) entries of a legacy logprobs object: the prompt's characters and their logprobs."""
    assert logprobs.tokens[:len(ids)] == list(PROMPT)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert logprobs.token_logprobs[i] == pytest.approx(reference[i - 1, ids[i]].item(), abs=1e-4)
        assert len(logprobs.top_logprobs[i]) == top_n
        best = reference[i - 1].max().item()
        assert max(logprobs.top_logprobs[i].values()) == pytest.approx(best, abs=1e-4)
    text = "".join(logprobs.tokens)
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    assert text.startswith(PROMPT)


def test_echo_max_tokens_zero_returns_the_prompt_with_its_logprobs(served):
    client, _, ids, reference = served
    choice = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2).choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids)
    check_prompt_part(choice.logprobs, ids, reference, 2)


def test_echo_with_generated_tokens_covers_prompt_then_completion(served):
    client, _, ids, reference = served
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1,
                                      extra_body={"ignore_eos": True}).choices[0]
    echo = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1,
                                     echo=True, extra_body={"ignore_eos": True}).choices[0]
    assert echo.text == PROMPT + plain.text
    check_prompt_part(echo.logprobs, ids, reference, 1)
    assert echo.logprobs.tokens[len(ids):] == plain.logprobs.tokens
    assert echo.logprobs.token_logprobs[len(ids):] == pytest.approx(plain.logprobs.token_logprobs)
    without = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True).choices[0]
    assert without.text.startswith(PROMPT) and without.logprobs is None


def test_echo_of_token_ids_and_several_prompts_and_samples(served):
    client, _, ids, _ = served
    response = client.completions.create(model=MODEL, prompt=[PROMPT, "ab"], max_tokens=1, n=2, echo=True,
                                         extra_body={"ignore_eos": True})
    texts = [c.text for c in sorted(response.choices, key=lambda c: c.index)]
    assert [t[:-1] for t in texts] == [PROMPT, PROMPT, "ab", "ab"]
    assert response.usage.completion_tokens == 4 and response.usage.prompt_tokens == len(ids) + 2
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=0).choices[0]
    assert by_ids.text == PROMPT and by_ids.logprobs.tokens == list(PROMPT)


def test_prompt_logprobs_field_as_vllm_returns_it(served):
    _, url, ids, reference = served
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 1, "logprobs": 3, "echo": True}
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    prompt_logprobs = choice["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for i, entries in enumerate(prompt_logprobs[1:], start=1):
        first_id, first = next(iter(entries.items()))
        assert int(first_id) == ids[i] and first["decoded_token"] == PROMPT[i]
        assert first["logprob"] == pytest.approx(reference[i - 1, ids[i]].item(), abs=1e-4)
        assert first["rank"] == int((reference[i - 1] > reference[i - 1, ids[i]]).sum()) + 1
        assert sorted(e["rank"] for e in entries.values())[:1] == [min(first["rank"], 1)]
        assert len(entries) <= 2  # the prompt token and the top 1, although echo asked for the top 3
    assert len(choice["logprobs"]["top_logprobs"][1]) == 3


def test_streamed_echo_starts_with_the_prompt(served):
    client, _, ids, reference = served
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                     logprobs=1, extra_body={"ignore_eos": True}).choices[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                            logprobs=1, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == full.text
    assert chunks[0].choices[0].text.startswith(PROMPT)
    check_prompt_part(chunks[0].choices[0].logprobs, ids, reference, 1)
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == full.logprobs.tokens
    only_prompt = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, stream=True))
    assert [c.choices[0].text for c in only_prompt] == [PROMPT]
    assert only_prompt[0].choices[0].finish_reason == "length"


def test_max_tokens_zero_without_echo_is_an_empty_completion(served):
    client, *_ = served
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert response.choices[0].text == "" and response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 0
