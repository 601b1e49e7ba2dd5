"""Qwen3's per-head q / k RMSNorm fused into the RoPE kernel, against the two torch twins in sequence.

Without CUDA the kernel runs in Triton's interpreter (fp32 / fp16); ``cuda``-marked tests go through the layer's
dispatch in bf16 / fp16 / fp32. The plain rotation (no norm) is covered by test_kernels_small_ops.py.
"""

import pytest
import torch

pytest.importorskip("triton")

from nanocore.kernels.rotary import rotary_embedding  # noqa: E402
from nanocore.layers.norm import RMSNorm, rms_norm_reference  # noqa: E402
from nanocore.layers.rotary import RotaryEmbedding, rotary_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
#: q's eps is negligible, k's is of the size of a head's mean square: a kernel that mixes them up is caught.
EPS = (1e-6, 0.5)


def randn(*shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(*shape, device=device).to(dtype)


def qk_norm_case(head_dim, dtype, tokens=5, hq=6, hkv=2, max_position=64, device=DEVICE, eps=EPS):
    """A packed qkv output (unit-scale values), positions, and Qwen3's two norms with random weights (never ones)."""
    rope = RotaryEmbedding(head_dim, max_position, 10000.0).to(device)
    positions = torch.randint(0, max_position, (tokens,), dtype=torch.int64, device=device)
    qkv = randn(tokens, (hq + 2 * hkv) * head_dim, dtype=dtype, device=device)
    norms = []
    for e in eps:
        norm = RMSNorm(head_dim, e, dtype).to(device)
        norm.weight.data.copy_(randn(head_dim, dtype=dtype, device=device) + 1.0)
        norms.append(norm)
    return rope, positions, qkv, [hq * head_dim, hkv * head_dim, hkv * head_dim], norms


def norm_then_rotate(rope, positions, q, k, norms, head_dim):
    """Qwen3's order as separate torch ops: RMSNorm of each q / k head, then RoPE."""
    nq, nk = (rms_norm_reference(x.reshape(x.shape[0], -1, head_dim), n.weight, n.eps).reshape(x.shape)
              for x, n in zip((q, k), norms))
    return rotary_reference(positions, nq, nk, rope.cos_sin_cache, head_dim, head_dim)


def fused(rope, positions, q, k, norms, head_dim, eps=None):
    eps = eps or (norms[0].eps, norms[1].eps)
    return rotary_embedding(positions, q, k, rope.cos_sin_cache, head_dim, head_dim,
                            ((norms[0].weight, eps[0]), (norms[1].weight, eps[1])))


def ulp_close(got, want):
    """fp16: the twins' result up to one rounding (the kernel sums a head's squares in another order); fp32: a few
    ulps (Triton's rsqrt)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    eps = torch.finfo(got.dtype).eps
    ulps = 1.0 if got.dtype == torch.float16 else 8.0
    torch.testing.assert_close(got.float(), want.float(), rtol=ulps * eps, atol=ulps * eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 32, 96])
def test_fused_qk_norm_rotary_in_place(dtype, head_dim):
    torch.manual_seed(head_dim)
    rope, positions, qkv, sizes, norms = qk_norm_case(head_dim, dtype)
    q, k, v = qkv.split(sizes, dim=-1)  # strided slices of the qkv output, as the decoder passes them
    want_q, want_k = norm_then_rotate(rope, positions, q, k, norms, head_dim)
    v_before = v.clone()
    got_q, got_k = fused(rope, positions, q, k, norms, head_dim)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    ulp_close(got_q, want_q)
    ulp_close(got_k, want_k)
    assert torch.equal(v, v_before)


def test_fused_qk_norm_uses_each_side_its_own_eps():
    """Swapping q's and k's eps changes k by far more than a rounding: the check above would catch a mix-up."""
    torch.manual_seed(3)
    rope, positions, qkv, sizes, norms = qk_norm_case(64, torch.float32)
    q, k, _ = qkv.split(sizes, dim=-1)
    _, want_k = norm_then_rotate(rope, positions, q, k, norms, 64)
    _, swapped_k = fused(rope, positions, q.clone(), k.clone(), norms, 64, eps=EPS[::-1])
    assert (swapped_k - want_k).abs().max() > 1e-2


def test_fused_qk_norm_refuses_what_it_cannot_fuse():
    rope, positions, qkv, sizes, _ = qk_norm_case(64, torch.float16)
    q, k, _ = qkv.split(sizes, dim=-1)
    fp32_norms = ((randn(64), 1e-6), (randn(64), 1e-6))  # fp32 weights would promote the reference's output
    with pytest.raises(ValueError, match="dtype"):
        rotary_embedding(positions, q, k, rope.cos_sin_cache, 64, 64, fp32_norms)
    partial = RotaryEmbedding(64, 64, 10000.0, rotary_dim=32).to(DEVICE)
    with pytest.raises(ValueError, match="rotary_dim == head_dim"):
        rotary_embedding(positions, q, k, partial.cos_sin_cache, 64, 32, ((q.new_ones(64), 1e-6),) * 2)


def test_layer_with_qk_norm_on_cpu_is_the_reference_composition():
    """The layer's non-CUDA path normalizes with the modules, then rotates; one norm alone is refused."""
    rope, positions, qkv, sizes, norms = qk_norm_case(64, torch.float32, device="cpu")
    q, k, _ = qkv.split(sizes, dim=-1)
    want_q, want_k = norm_then_rotate(rope, positions, q, k, norms, 64)
    got_q, got_k = rope(positions, q, k, *norms)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    with pytest.raises(ValueError, match="q_norm and k_norm go together"):
        rope(positions, q, k, norms[0], None)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim,hq,hkv", [(128, 16, 8), (128, 32, 4), (64, 9, 3)])
@pytest.mark.parametrize("tokens", [1, 257])
def test_cuda_rotary_layer_with_qk_norm(dtype, head_dim, hq, hkv, tokens):
    """Through the layer's dispatch: in place (the fused kernel ran), within a few roundings of the twins."""
    torch.manual_seed(tokens + hq)
    rope, positions, qkv, sizes, norms = qk_norm_case(head_dim, dtype, tokens=tokens, hq=hq, hkv=hkv,
                                                      max_position=4096)
    q, k, v = qkv.split(sizes, dim=-1)
    want_q, want_k = norm_then_rotate(rope, positions, q, k, norms, head_dim)
    v_before = v.clone()
    magnitude = float(torch.maximum(want_q.float().abs().max(), want_k.float().abs().max()))
    got_q, got_k = rope(positions, q, k, *norms)
    assert got_q.data_ptr() == q.data_ptr()
    eps = torch.finfo(dtype).eps * (32.0 if dtype == torch.float32 else 4.0)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        torch.testing.assert_close(got.float(), want.float(), rtol=eps, atol=eps * magnitude)
    assert torch.equal(v, v_before)


@pytest.mark.cuda
@cuda
def test_cuda_layer_falls_back_to_separate_norms_for_partial_rotary():
    """A partial rotary with q / k norms cannot fuse: the norms run alone, then the plain rotation kernel."""
    torch.manual_seed(5)
    rope, positions, qkv, sizes, norms = qk_norm_case(128, torch.bfloat16, tokens=7, hq=4, hkv=2)
    partial = RotaryEmbedding(128, 64, 10000.0, rotary_dim=64).cuda()
    q, k, _ = qkv.split(sizes, dim=-1)
    nq, nk = (rms_norm_reference(x.reshape(7, -1, 128), n.weight, n.eps).reshape(x.shape)
              for x, n in zip((q, k), norms))
    want_q, want_k = rotary_reference(positions, nq, nk, partial.cos_sin_cache, 128, 64)
    got_q, got_k = partial(positions, q, k, *norms)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
