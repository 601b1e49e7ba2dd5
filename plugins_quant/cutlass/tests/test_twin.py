"""The torch twin: the numerics the CUDA kernel is held to, checked on CPU."""
import pytest
import torch
import torch.nn.functional as F

from nanocore.toolkit.numerics import FP8_MAX, quantize_fp8_per_row
from nanocore_cutlass.twin import fp8_linear_twin, fp8_scaled_mm_torch, quantize_activations


def _weights(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * k ** -0.5, torch.randn(7, k, generator=g) * 3


@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (5, 24, 40), (33, 64, 128)])
def test_twin_is_dequantized_matmul_with_row_and_column_scales(m, n, k):
    w, _ = _weights(n, k, m)
    x = torch.randn(m, k) * torch.rand(m, 1).add(0.1) * 10  # rows of very different ranges: per-token scales matter
    wq, ws = quantize_fp8_per_row(w)
    xq, xs = quantize_activations(x)
    assert xs.shape == (m, 1) and torch.equal(xs, x.abs().amax(1, keepdim=True) / FP8_MAX)
    expected = (xq.double() * xs.double()) @ (wq.double() * ws.double()).t()
    torch.testing.assert_close(fp8_scaled_mm_torch(xq, xs, wq, ws, torch.float32), expected.float(),
                               rtol=1e-5, atol=1e-5)
    got = fp8_linear_twin(x, wq, ws)
    exact = F.linear(x, w)
    assert ((got - exact).abs() <= 0.07 * exact.abs().max()).all()


def test_static_scale_is_used_for_every_row_and_clamps():
    w, x = _weights(16, 32, 1)
    wq, ws = quantize_fp8_per_row(w)
    scale = torch.tensor([x.abs().max().item() / FP8_MAX / 2])  # half the range: the largest values clamp
    xq, xs = quantize_activations(x, scale)
    assert torch.equal(xs, scale.expand(x.shape[0], 1))
    assert xq.float().abs().max() == FP8_MAX
    torch.testing.assert_close(fp8_linear_twin(x, wq, ws, scale), fp8_scaled_mm_torch(xq, xs, wq, ws, torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_twin_output_is_in_the_input_dtype(dtype):
    w, x = _weights(8, 16, 2)
    wq, ws = quantize_fp8_per_row(w)
    out = fp8_linear_twin(x.to(dtype), wq, ws)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), fp8_linear_twin(x.to(dtype).float(), wq, ws), rtol=1e-2, atol=1e-2)


def test_twin_never_calls_scaled_mm(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the twin must not use torch._scaled_mm")

    monkeypatch.setattr(torch, "_scaled_mm", refuse, raising=False)
    w, x = _weights(8, 16, 3)
    wq, ws = quantize_fp8_per_row(w)
    assert torch.isfinite(fp8_linear_twin(x, wq, ws)).all()
