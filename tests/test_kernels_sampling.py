"""The fused Gumbel-max sampling kernel against its torch twin (same Philox uniforms), its distribution, and
the Sampler's choice between the kernel and the torch path. On CPU the kernel runs in the Triton interpreter."""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from nanocore.kernels.sampling import gumbel_argmax, gumbel_argmax_reference  # noqa: E402
from nanocore.layers.sampler import Sampler, SamplingTensors  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _uniforms_kernel(seed_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    # the same Philox stream the sampling kernel draws: counter row * vocab + column
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    u = tl.rand(tl.load(seed_ptr), row * vocab + cols)
    tl.store(out_ptr + row * vocab + cols, tl.maximum(u, 1e-30), mask=cols < vocab)


def uniforms_for(seed: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    out = torch.empty((n, vocab), dtype=torch.float32, device=DEVICE)
    _uniforms_kernel[(n, triton.cdiv(vocab, 128))](seed, out, vocab, BLOCK=128)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_twin_on_the_same_uniforms(dtype):
    torch.manual_seed(0)
    n, vocab = 5, 9000 if DEVICE == "cuda" else 2100  # > one chunk on the GPU; a partial block either way
    logits = (torch.randn(n, vocab, device=DEVICE) * 3).to(dtype)
    temps = torch.tensor([0.6, 0.0, 1.0, 1.7, 0.05], device=DEVICE)
    seed = torch.tensor([1234], dtype=torch.int64, device=DEVICE)
    got = gumbel_argmax(logits, temps, seed)
    want = gumbel_argmax_reference(logits, temps, uniforms_for(seed, n, vocab))
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert got[1] == logits[1].argmax()  # the greedy row


def test_greedy_ties_take_the_lowest_index():
    vocab = 3000
    logits = torch.zeros(2, vocab, device=DEVICE)
    logits[0, [2999, 1500, 7]] = 5.0  # tie across blocks and lanes
    logits[1, [1025, 1]] = 2.0
    got = gumbel_argmax(logits, torch.zeros(2, device=DEVICE), torch.tensor([3], device=DEVICE))
    assert got.tolist() == [7, 1]


def test_samples_follow_softmax_of_scaled_logits():
    torch.manual_seed(1)
    rows, vocab, temp = 4000 if DEVICE == "cuda" else 600, 6, 0.7
    base = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, 1.3], device=DEVICE)
    got = gumbel_argmax(base.expand(rows, vocab).contiguous(), torch.full((rows,), temp, device=DEVICE),
                        torch.tensor([99], device=DEVICE))
    freq = torch.bincount(got, minlength=vocab).float() / rows
    want = torch.softmax(base / temp, dim=0)
    assert (freq - want).abs().max() < 4 * (want * (1 - want) / rows).sqrt().max()  # ~4 standard errors


def test_seed_makes_it_reproducible_and_different_seeds_differ():
    logits = torch.randn(16, 1000, device=DEVICE)
    temps = torch.ones(16, device=DEVICE)
    one = gumbel_argmax(logits, temps, torch.tensor([5], device=DEVICE))
    assert torch.equal(one, gumbel_argmax(logits, temps, torch.tensor([5], device=DEVICE)))
    assert not torch.equal(one, gumbel_argmax(logits, temps, torch.tensor([6], device=DEVICE)))


def plain_params(temps: torch.Tensor, **kw) -> SamplingTensors:
    n = temps.shape[0]
    return SamplingTensors(temperatures=temps, top_k=None, top_p=None, min_p=None, generators=[None] * n,
                           all_greedy=bool((temps == 0).all()), any_greedy=bool((temps == 0).any()), seeded_rows=[],
                           **kw)


def test_sampler_uses_the_kernel_only_when_it_is_exact(monkeypatch):
    calls = []
    monkeypatch.setattr("nanocore.kernels.sampling.gumbel_argmax", lambda *a: calls.append(a) or a[0].argmax(-1))
    sampler = Sampler()
    logits = torch.randn(3, 50, device=DEVICE)
    temps = torch.tensor([0.5, 1.0, 0.0], device=DEVICE)
    sampler(logits, plain_params(temps))
    assert len(calls) == (1 if DEVICE == "cuda" else 0)  # CPU tensors always take the torch path
    calls.clear()
    for blocked in (dict(top_k=torch.tensor([5, 0, 0], device=DEVICE)), dict(max_num_logprobs=2)):
        params = plain_params(temps)
        for key, value in blocked.items():
            setattr(params, key, value)
        sampler(logits, params)
    assert calls == []
