"""Sampler: greedy, top-k / top-p / min-p masks, seeded reproducibility, logprobs; SamplingParams checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nanocore.engine.sampling_params import SamplingParams
from nanocore.layers.sampler import Sampler, SamplingTensors, apply_min_p, apply_top_k_top_p

VOCAB = 50


def tensors(n, temperature=1.0, top_k=None, top_p=None, min_p=None, generators=None, logprobs=None):
    temps = torch.full((n,), float(temperature))
    return SamplingTensors(
        temperatures=temps,
        top_k=None if top_k is None else torch.as_tensor(top_k).expand(n).clone(),
        top_p=None if top_p is None else torch.as_tensor(top_p, dtype=torch.float32).expand(n).clone(),
        min_p=None if min_p is None else torch.as_tensor(min_p, dtype=torch.float32).expand(n).clone(),
        generators=generators or [None] * n, all_greedy=temperature == 0, any_greedy=temperature == 0,
        max_num_logprobs=logprobs,
    )


def random_logits(n=4, seed=0):
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = random_logits()
    out = Sampler()(logits, tensors(4, temperature=0))
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_mixed_greedy_and_random_rows():
    logits = random_logits()
    params = tensors(4)
    params.temperatures = torch.tensor([0.0, 1.0, 0.0, 1.0])
    params.any_greedy = True
    out = Sampler(torch.Generator().manual_seed(0))(logits, params)
    assert out.token_ids[0] == logits[0].argmax() and out.token_ids[2] == logits[2].argmax()


def test_top_k_keeps_exactly_k():
    logits = random_logits()
    masked = apply_top_k_top_p(logits, torch.tensor([1, 3, 0, VOCAB]), None)
    assert (masked > float("-inf")).sum(-1).tolist() == [1, 3, VOCAB, VOCAB]
    top3 = set(logits[1].topk(3).indices.tolist())
    assert set(torch.nonzero(masked[1] > float("-inf")).flatten().tolist()) == top3


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    masked = apply_top_k_top_p(logits, None, torch.tensor([0.75, 0.1]))
    assert (masked[0] > float("-inf")).tolist() == [True, True, False, False]
    assert (masked[1] > float("-inf")).tolist() == [True, False, False, False]  # always at least one


def test_min_p_masks_relative_to_max():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    masked = apply_min_p(logits, torch.tensor([0.5]))
    assert (masked[0] > float("-inf")).tolist() == [True, True, False, False]


def test_sampling_respects_masks():
    logits = random_logits(n=64, seed=1)
    out = Sampler(torch.Generator().manual_seed(0))(logits, tensors(64, temperature=1.5, top_k=2))
    top2 = logits.topk(2).indices
    assert all(t in row for t, row in zip(out.token_ids.tolist(), top2.tolist()))


def test_seeded_rows_do_not_depend_on_the_batch():
    logits = random_logits(n=3, seed=2).repeat(2, 1)  # rows 0-2 and 3-5 are the same distributions

    def sample(rows, seeds, others_seed):
        gens = [torch.Generator().manual_seed(s) if s is not None else None for s in seeds]
        return Sampler(torch.Generator().manual_seed(others_seed))(logits[rows], tensors(len(rows), generators=gens))

    alone = sample([1], [123], 0).token_ids
    in_batch = sample([0, 1, 2, 5], [None, 123, 7, None], 99).token_ids
    assert in_batch[1] == alone[0]
    draws = [sample([4], [s], 0).token_ids.item() for s in range(20)]
    assert len(set(draws)) > 1  # the seed matters
    assert draws == [sample([1], [s], 5).token_ids.item() for s in range(20)]


def test_sampling_matches_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3).clone()
    out = Sampler(torch.Generator().manual_seed(0))(logits, tensors(20000))
    freq = torch.bincount(out.token_ids, minlength=3).float() / 20000
    assert torch.allclose(freq, probs, atol=0.02)


def test_logprobs_top_n_and_sampled_token():
    logits = random_logits()
    out = Sampler()(logits, tensors(4, temperature=0, logprobs=3))
    expected = logits.log_softmax(-1)
    assert out.logprob_token_ids.shape == (4, 4)
    assert torch.equal(out.logprob_token_ids[:, 0], logits.argmax(-1))
    assert torch.equal(out.logprob_token_ids[:, 1:], expected.topk(3).indices)
    assert torch.allclose(out.logprobs[:, 1:], expected.topk(3).values)
    assert out.sampled_ranks.tolist() == [1, 1, 1, 1]


def test_banned_tokens_are_never_sampled():
    logits = torch.zeros(2, VOCAB)
    logits[:, 7] = 10.0
    params = tensors(2, temperature=0)
    params.banned = (torch.tensor([0]), torch.tensor([7]))
    out = Sampler()(logits, params)
    assert out.token_ids[0] != 7 and out.token_ids[1] == 7


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n must be"), ({"temperature": -0.1}, "temperature must be"), ({"top_k": -2}, "top_k must be"),
    ({"top_p": 0.0}, "top_p must be"), ({"top_p": 1.5}, "top_p must be"), ({"min_p": 2.0}, "min_p must be"),
    ({"max_tokens": -1}, "max_tokens must be"), ({"prompt_logprobs": -1}, "prompt_logprobs must be"),
    ({"prompt_logprobs": True}, "prompt_logprobs must be"), ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"seed": -1}, "seed must be"), ({"logprobs": -1}, "logprobs must be"), ({"stop": [""]}, "stop must be"),
    # wrong types and non-finite values: a clear ValueError, not a TypeError from a comparison or a crash in the
    # sampler (logprobs=True reached torch.topk; temperature=inf sampled NaNs; seed=2**70 overflowed manual_seed)
    ({"temperature": float("inf")}, "temperature must be"), ({"temperature": "0.5"}, "temperature must be"),
    ({"temperature": None}, "temperature must be"), ({"top_p": None}, "top_p must be"),
    ({"min_p": "0.1"}, "min_p must be"), ({"max_tokens": "5"}, "max_tokens must be"),
    ({"min_tokens": "a"}, "min_tokens must be"), ({"n": True}, "n must be"), ({"top_k": True}, "top_k must be"),
    ({"logprobs": True}, "logprobs must be"), ({"seed": 2**64}, "seed must be"), ({"seed": True}, "seed must be"),
    ({"stop": 5}, "stop must be a string or a list"), ({"stop": {"a": 1}}, "stop must be a string or a list"),
    ({"stop_token_ids": 5}, "stop_token_ids must be a list"), ({"stop_token_ids": ["x"]}, "stop_token_ids must be a list"),
])
def test_invalid_sampling_params_say_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_normalisation():
    p = SamplingParams(top_k=-1, stop="###", stop_token_ids=[5])
    assert p.top_k == 0 and p.stop_strings == ["###"] and p.stop_token_ids == [5]
    p = SamplingParams(stop=("a", "b"), stop_token_ids=(np.int64(3),), seed=2**64 - 1, temperature=np.float32(0.5))
    assert p.stop_strings == ["a", "b"] and p.stop_token_ids == [3]
    assert SamplingParams(temperature=0).greedy


def test_numpy_and_torch_scalars_and_any_iterable_of_ids_are_accepted_as_plain_python_values():
    """What the validation must keep accepting (and normalise: torch.manual_seed refuses a numpy int)."""
    p = SamplingParams(seed=np.uint64(5), n=np.int64(2), max_tokens=np.int32(4), temperature=torch.tensor(0.5),
                       top_p=np.float32(0.5), stop_token_ids={7, 8}, stop={"x"})
    assert (p.seed, p.n, p.max_tokens) == (5, 2, 4) and type(p.seed) is int and type(p.n) is int
    assert type(p.temperature) is float and p.temperature == 0.5 and type(p.top_p) is float
    assert sorted(p.stop_token_ids) == [7, 8] and p._stop == ["x"]
    assert SamplingParams(stop_token_ids=range(3)).stop_token_ids == [0, 1, 2]
    assert SamplingParams(stop_token_ids=np.array([4, 5])).stop_token_ids == [4, 5]
    torch.Generator().manual_seed(p.seed)
    for bad in (dict(stop_token_ids=5), dict(stop_token_ids="12"), dict(temperature=torch.tensor([0.5, 1.0]))):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


@pytest.mark.parametrize("case", ["greedy", "banned", "logprobs", "top_k_top_p_min_p", "seeded"])
def test_model_dtype_logits_sample_as_their_float32_copy(case):
    """compute_logits hands the sampler bf16 logits: every path gives the tokens (and logprobs) of their float32
    copy (the torch path converts once; argmax on bf16 is exact)."""
    logits = random_logits(n=6, seed=4).to(torch.bfloat16)

    def params():
        p = {"greedy": lambda: tensors(6, temperature=0), "logprobs": lambda: tensors(6, temperature=0, logprobs=4),
             "banned": lambda: tensors(6, temperature=0),
             "top_k_top_p_min_p": lambda: tensors(6, top_k=5, top_p=0.9, min_p=0.05),
             "seeded": lambda: tensors(6, generators=[torch.Generator().manual_seed(i) for i in range(6)])}[case]()
        if case == "banned":
            p.banned = (torch.tensor([0, 3]), logits.float().argmax(-1)[[0, 3]])
        return p

    got = Sampler(torch.Generator().manual_seed(1))(logits, params())
    want = Sampler(torch.Generator().manual_seed(1))(logits.float(), params())
    assert torch.equal(got.token_ids, want.token_ids)
    if case == "logprobs":
        assert torch.equal(got.logprob_token_ids, want.logprob_token_ids)
        assert torch.equal(got.logprobs, want.logprobs)
