"""Triton RMSNorm (+ residual), rotary and SiLU-and-mul against their torch twins, on random inputs.

Without CUDA the kernels run in Triton's interpreter (fp32/fp16, small shapes). ``cuda``-marked tests
cover bf16/fp16/fp32 through the layers' dispatch and a CUDA-graph capture (no host syncs).
"""

import pytest
import torch

pytest.importorskip("triton")

from nanocore.kernels import rmsnorm as rmsnorm_kernels  # noqa: E402
from nanocore.kernels.activation import silu_and_mul  # noqa: E402
from nanocore.kernels.rmsnorm import rms_norm  # noqa: E402
from nanocore.kernels.rotary import rotary_embedding  # noqa: E402
from nanocore.layers.activation import SiluAndMul, silu_and_mul_reference  # noqa: E402
from nanocore.layers.norm import RMSNorm, rms_norm_reference  # noqa: E402
from nanocore.layers.rotary import RotaryEmbedding, rotary_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def randn(*shape, dtype=torch.float32, device=DEVICE, scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


def close(a, b, exact=False):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if exact:
        assert torch.equal(a, b), (a.float() - b.float()).abs().max()
    else:
        torch.testing.assert_close(a, b)


def close_to_rounding(got, want, magnitude: float, ulps: float = 2.0):
    """Equal up to a few roundings of intermediates of size ``magnitude`` in the output dtype. The torch twin
    rounds every product to the dtype; the compiled kernel may keep them in fp32 (fewer roundings), so a
    result much smaller than its products (cancellation) can differ by more than a relative tolerance allows."""
    assert got.shape == want.shape and got.dtype == want.dtype
    eps = torch.finfo(got.dtype).eps
    if got.dtype == torch.float32:  # no rounding to hide behind: Triton's fast exp / rsqrt are a few ulps off
        ulps = max(ulps, 32.0)
    torch.testing.assert_close(got.float(), want.float(), rtol=ulps * eps, atol=ulps * eps * magnitude)


def check_rms_norm(x, weight, residual, eps=1e-6):
    got = rms_norm(x, weight, eps, residual)
    want = rms_norm_reference(x, weight, eps, residual)
    if residual is None:
        close(got, want)
    else:
        close(got[0], want[0])
        close(got[1], want[1], exact=True)  # the residual is a plain rounded sum


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [576, 1024, 64, 128, 100])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, hidden, with_residual):
    torch.manual_seed(hidden)
    x = randn(5, hidden, dtype=dtype, scale=3.0)
    weight = randn(hidden, dtype=dtype) + 1.0
    check_rms_norm(x, weight, randn(5, hidden, dtype=dtype) if with_residual else None)


def test_rms_norm_per_head_strided_slice():
    """Qwen3's q/k norm: [T, H, D] views of the qkv output, rows = tokens * heads, no copy."""
    torch.manual_seed(1)
    tokens, hq, hkv, d = 3, 4, 2, 64
    qkv = randn(tokens, (hq + 2 * hkv) * d, dtype=torch.float16)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    for x, h in ((q, hq), (k, hkv)):
        x3 = x.reshape(-1, h, d)
        assert not x3.is_contiguous()
        check_rms_norm(x3, randn(d, dtype=torch.float16) + 1.0, None)


def test_rms_norm_mixed_dtypes_and_leading_dims():
    torch.manual_seed(2)
    x = randn(2, 3, 96, dtype=torch.float16)
    check_rms_norm(x, randn(96) + 1.0, None)  # fp32 weight: fp32 output, like torch's promotion
    check_rms_norm(x, randn(96, dtype=torch.float16), randn(2, 3, 96, dtype=torch.float16))
    check_rms_norm(randn(0, 96), randn(96), randn(0, 96))


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_long_rows_loop(monkeypatch, with_residual):
    """Rows longer than the register tile take the two-pass loop (shrunk here to keep it fast)."""
    monkeypatch.setattr(rmsnorm_kernels, "MAX_TILE", 256)
    monkeypatch.setattr(rmsnorm_kernels, "LOOP_BLOCK", 128)
    torch.manual_seed(3)
    for dtype in (torch.float32, torch.float16):
        x = randn(3, 576, dtype=dtype, scale=2.0)
        check_rms_norm(x, randn(576, dtype=dtype), randn(3, 576, dtype=dtype) if with_residual else None)


def rotary_case(head_dim, rotary_dim, dtype, tokens=5, hq=4, hkv=2, max_position=64, device=DEVICE):
    rope = RotaryEmbedding(head_dim, max_position, 10000.0, rotary_dim=rotary_dim).to(device)
    positions = torch.randint(0, max_position, (tokens,), dtype=torch.int64, device=device)
    qkv = randn(tokens, (hq + 2 * hkv) * head_dim, dtype=dtype, device=device)
    return rope, positions, qkv, [hq * head_dim, hkv * head_dim, hkv * head_dim]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 128), (128, 64), (64, 32)])
def test_rotary_in_place(dtype, head_dim, rotary_dim):
    torch.manual_seed(head_dim + rotary_dim)
    rope, positions, qkv, sizes = rotary_case(head_dim, rotary_dim, dtype)
    q, k, v = qkv.split(sizes, dim=-1)  # strided slices of the qkv output, as the decoder passes them
    want_q, want_k = rotary_reference(positions, q, k, rope.cos_sin_cache, head_dim, rotary_dim)
    v_before = v.clone()
    got_q, got_k = rotary_embedding(positions, q, k, rope.cos_sin_cache, head_dim, rotary_dim)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    # x1 * cos - x2 * sin: the compiled kernel may keep a product in fp32 (H200, session 12: 1 fp16 ulp at the
    # products' size where they cancel, in 0.5-1.8% of the elements); the interpreter rounds as torch does
    magnitude = qkv.float().abs().max().item()
    close_to_rounding(got_q, want_q, magnitude)
    close_to_rounding(got_k, want_k, magnitude)
    assert torch.equal(v, v_before)


def test_rotary_three_dim_heads():
    torch.manual_seed(4)
    rope, positions, qkv, sizes = rotary_case(64, 64, torch.float32, tokens=3, hq=3, hkv=1)
    q, k = qkv[:, :sizes[0]].contiguous().view(3, 3, 64), qkv[:, sizes[0]:sizes[0] + sizes[1]].contiguous()
    want_q, want_k = rotary_reference(positions, q, k, rope.cos_sin_cache, 64, 64)
    got_q, got_k = rotary_embedding(positions, q.clone(), k.clone(), rope.cos_sin_cache, 64, 64)
    close(got_q, want_q)
    close(got_k, want_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("inter", [64, 576, 1500, 3072])
def test_silu_and_mul(dtype, inter):
    torch.manual_seed(inter)
    x = randn(3, 2 * inter, dtype=dtype, scale=3.0)
    close(silu_and_mul(x), silu_and_mul_reference(x))


def test_silu_and_mul_leading_dims_and_strides():
    torch.manual_seed(5)
    x = randn(2, 3, 256)
    close(silu_and_mul(x), silu_and_mul_reference(x))
    wide = randn(4, 300)[:, :256]  # row stride != width
    close(silu_and_mul(wide), silu_and_mul_reference(wide))


def test_layers_on_cpu_use_the_reference():
    torch.manual_seed(6)
    norm = RMSNorm(64)
    norm.weight.data.copy_(randn(64, device="cpu"))
    x, r = randn(3, 64, device="cpu"), randn(3, 64, device="cpu")
    close(norm(x), rms_norm_reference(x, norm.weight, norm.eps), exact=True)
    x2 = randn(3, 128, device="cpu")
    close(SiluAndMul()(x2), silu_and_mul_reference(x2), exact=True)
    got = norm(x, r)
    want = rms_norm_reference(x, norm.weight, norm.eps, r)
    close(got[0], want[0], exact=True)
    close(got[1], want[1], exact=True)


CUDA_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("hidden", [576, 1024, 2048, 4096, 8192, 12288, 128])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_cuda_rms_norm_layer(dtype, hidden, rows):
    torch.manual_seed(hidden + rows)
    norm = RMSNorm(hidden, 1e-6, dtype).cuda()
    norm.weight.data.copy_(randn(hidden, dtype=dtype) + 1.0)
    x, r = randn(rows, hidden, dtype=dtype, scale=3.0), randn(rows, hidden, dtype=dtype)
    # the twin rounds x * rsqrt to the dtype before the weight multiply; the kernel rounds once: <= 2 roundings
    close_to_rounding(norm(x), rms_norm_reference(x, norm.weight, norm.eps), magnitude=1e-3)
    got, want = norm(x, r), rms_norm_reference(x, norm.weight, norm.eps, r)
    close_to_rounding(got[0], want[0], magnitude=1e-3)
    close(got[1], want[1], exact=True)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("tokens", [1, 33, 1000])
def test_cuda_qk_norm_strided(dtype, tokens):
    torch.manual_seed(tokens)
    hq, hkv, d = 16, 8, 128
    qkv = randn(tokens, (hq + 2 * hkv) * d, dtype=dtype)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    norm = RMSNorm(d, 1e-6, dtype).cuda()
    norm.weight.data.copy_(randn(d, dtype=dtype) + 1.0)
    for x, h in ((q, hq), (k, hkv)):
        x3 = x.reshape(-1, h, d)
        close_to_rounding(norm(x3), rms_norm_reference(x3, norm.weight, norm.eps), magnitude=1e-3)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("head_dim,rotary_dim,hq,hkv", [(128, 128, 16, 8), (64, 64, 9, 3), (128, 64, 32, 8)])
@pytest.mark.parametrize("tokens", [1, 257])
def test_cuda_rotary_layer(dtype, head_dim, rotary_dim, hq, hkv, tokens):
    torch.manual_seed(tokens + hq)
    rope, positions, qkv, sizes = rotary_case(head_dim, rotary_dim, dtype, tokens, hq, hkv, max_position=4096)
    q, k, v = qkv.split(sizes, dim=-1)
    want_q, want_k = rotary_reference(positions, q, k, rope.cos_sin_cache, head_dim, rotary_dim)
    v_before = v.clone()
    magnitude = float(qkv.float().abs().max())  # |cos|, |sin| <= 1: products are at most this large
    got_q, got_k = rope(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr()  # the Triton path ran (in place)
    close_to_rounding(got_q, want_q, magnitude)
    close_to_rounding(got_k, want_k, magnitude)
    assert torch.equal(v, v_before)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("inter", [3072, 1536, 14336, 100])
@pytest.mark.parametrize("rows", [1, 300])
def test_cuda_silu_and_mul_layer(dtype, inter, rows):
    torch.manual_seed(inter + rows)
    x = randn(rows, 2 * inter, dtype=dtype, scale=3.0)
    # no cancellation here: a relative bound of a few roundings (fp32 exp differs from torch's by an ulp)
    close_to_rounding(SiluAndMul()(x), silu_and_mul_reference(x), magnitude=1e-3)


@pytest.mark.cuda
@cuda
def test_cuda_graph_capture_replays():
    """The three kernels capture into a CUDA graph (no host syncs) and replay to the reference numbers."""
    torch.manual_seed(7)
    dtype, hidden, d = torch.bfloat16, 1024, 128
    norm = RMSNorm(hidden, 1e-6, dtype).cuda()
    norm.weight.data.copy_(randn(hidden, dtype=dtype) + 1.0)
    rope, positions, qkv, sizes = rotary_case(d, d, dtype, tokens=4, hq=8, hkv=2, max_position=512)
    x, r, act_in = randn(4, hidden, dtype=dtype), randn(4, hidden, dtype=dtype), randn(4, 2 * 3072, dtype=dtype)

    def step():
        qkv_work = qkv.clone()
        q, k, _ = qkv_work.split(sizes, dim=-1)
        return (*norm(x, r), *rope(positions, q, k), SiluAndMul()(act_in))

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    graph.replay()
    torch.cuda.synchronize()
    q, k, _ = qkv.split(sizes, dim=-1)
    want = (*rms_norm_reference(x, norm.weight, norm.eps, r),
            *rotary_reference(positions, q, k, rope.cos_sin_cache, d, d), silu_and_mul_reference(act_in))
    for got, ref in zip(outs, want):
        close_to_rounding(got, ref, float(ref.float().abs().max()) + 1.0)
