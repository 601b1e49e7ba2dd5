"""nanocore.toolkit.act_quant (one-pass per-token int8 / fp8 quantization) vs the numerics references."""
import os

import pytest
import torch

from nanocore.toolkit import act_quant
from nanocore.toolkit.act_quant import RECIPROCAL_QMAX, quantize_per_token, quantize_per_token_triton
from nanocore.toolkit.numerics import (
    FP8_DTYPE,
    quantize_fp8,
    quantize_fp8_per_row,
    quantize_int8,
    quantize_int8_per_row,
)

REFERENCES = {torch.int8: quantize_int8_per_row, FP8_DTYPE: quantize_fp8_per_row}
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton interpreter runs only without CUDA (see conftest.py)")


def _gpu_reference(x2: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """What the numerics references give on a GPU, on any device: there torch turns ``amax / qmax`` into
    ``amax * float32(1 / qmax)`` (on the CPU it divides: one ulp apart at times)."""
    if x2.is_cuda:
        return REFERENCES[dtype](x2)
    scale = (x2.float().abs().amax(dim=-1, keepdim=True) * RECIPROCAL_QMAX[dtype]).clamp_min(1e-12)
    return (quantize_int8 if dtype == torch.int8 else quantize_fp8)(x2, scale), scale


def _assert_same_as_reference(x2: torch.Tensor, dtype: torch.dtype, got: tuple[torch.Tensor, torch.Tensor],
                              reference=_gpu_reference) -> None:
    q, scale = got
    q_ref, scale_ref = reference(x2, dtype)
    assert q.dtype == dtype and q.shape == x2.shape and scale.shape == (x2.shape[0], 1)
    assert scale.dtype == torch.float32
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.int8), q_ref.view(torch.int8))  # bit for bit, fp8 included


def _rows(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows over several magnitudes (never zeros), one all-zero row when there are at least 3."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m).unsqueeze(1)
    if m >= 3:
        x[1] = 0.0
    return x.to(dtype)


@interpreter
@pytest.mark.parametrize("dtype", [torch.int8, FP8_DTYPE])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,k", [(1, 7), (3, 64), (5, 200), (17, 130)])
def test_kernel_matches_reference_bit_for_bit(monkeypatch, dtype, x_dtype, m, k):
    monkeypatch.setattr(act_quant, "_BLOCK_MAX", 64)  # rows longer than a block walk the loops several times
    x2 = _rows(m, k, x_dtype, seed=m * 100 + k)
    _assert_same_as_reference(x2, dtype, quantize_per_token_triton(x2, dtype))


@interpreter
def test_int8_ties_round_half_to_even_and_saturate():
    # amax 127 gives scale 1: the halves are exact ties; torch.round sends them to the even neighbour
    x2 = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -127.0]])
    q, scale = quantize_per_token_triton(x2, torch.int8)
    assert float(scale) == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, 126, -127]]


@interpreter
def test_fp8_ties_round_half_to_even():
    grid = torch.arange(0, 127, dtype=torch.int8).view(FP8_DTYPE).float()  # every finite e4m3 value >= 0 (0x7f: NaN)
    midpoints = (grid[1:] + grid[:-1]) / 2
    x2 = torch.cat([torch.tensor([448.0]), midpoints, -midpoints]).unsqueeze(0)  # scale 1: exact ties
    _assert_same_as_reference(x2, FP8_DTYPE, quantize_per_token_triton(x2, FP8_DTYPE))


@interpreter
@pytest.mark.parametrize("dtype", [torch.int8, FP8_DTYPE])
def test_strided_rows(dtype):
    base = _rows(6, 96, torch.bfloat16, seed=3)
    for view in (base[:, 16:80], base[:, ::2], base[::2]):  # a row stride above K, a column stride, every other row
        _assert_same_as_reference(view, dtype, quantize_per_token_triton(view, dtype))


def test_cpu_tensors_take_the_reference():
    x2 = _rows(4, 48, torch.float32, seed=5)
    for dtype in (torch.int8, FP8_DTYPE):
        _assert_same_as_reference(x2, dtype, quantize_per_token(x2, dtype), lambda x, d: REFERENCES[d](x))


def test_reciprocals_are_float32():
    # the kernel multiplies by these exactly as torch does on a GPU: float32 1 / qmax, exact as a Python float
    for dtype, qmax in ((torch.int8, 127.0), (FP8_DTYPE, 448.0)):
        assert RECIPROCAL_QMAX[dtype] == float(torch.tensor(1 / qmax, dtype=torch.float32))


@pytest.mark.parametrize("quantize", [quantize_per_token, pytest.param(quantize_per_token_triton, marks=interpreter)])
def test_no_rows(quantize):
    q, scale = quantize(torch.zeros(0, 16), torch.int8)
    assert q.shape == (0, 16) and scale.shape == (0, 1)


@interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, for the NaN / Inf the test feeds in
@pytest.mark.parametrize("dtype", [torch.int8, FP8_DTYPE])
def test_rows_with_nan_or_inf_are_nan_as_in_the_reference(dtype):
    x2 = _rows(4, 40, torch.float32, seed=9)
    x2[0, 3], x2[2, 7] = float("nan"), float("inf")
    q, scale = quantize_per_token_triton(x2, dtype)
    q_ref, scale_ref = _gpu_reference(x2, dtype)
    assert torch.equal(scale.isnan(), scale_ref.isnan()) and scale[0].isnan() and scale[2].isinf()
    assert torch.equal(scale[[1, 3]], scale_ref[[1, 3]])  # other rows untouched
    assert torch.equal(q[[1, 3]].view(torch.int8), q_ref[[1, 3]].view(torch.int8))
    # the codes of rows 0 / 2: fp8 NaN on a GPU (the cuda test); the interpreter's own e4m3 conversion maps NaN to a
    # finite value, and int8 has no NaN (undefined either way)


@pytest.mark.cuda
def test_fp8_rows_with_nan_or_inf_are_nan_on_cuda():
    x2 = _rows(4, 4096, torch.bfloat16, seed=9).cuda()
    x2[0, 3], x2[2, 7] = float("nan"), float("inf")
    q, scale = quantize_per_token(x2, FP8_DTYPE)
    q_ref, scale_ref = REFERENCES[FP8_DTYPE](x2)
    assert torch.equal(scale.isnan(), scale_ref.isnan()) and torch.equal(q.float().isnan(), q_ref.float().isnan())
    assert q[0].float().isnan().all() and torch.equal(q[[1, 3]].view(torch.int8), q_ref[[1, 3]].view(torch.int8))


@pytest.mark.parametrize("bad,message", [((torch.zeros(2, 3, 4), torch.int8), "reshape the activations"),
                                         ((torch.zeros(2, 0), torch.int8), "K > 0"),
                                         ((torch.zeros(2, 4, dtype=torch.int32), torch.int8), "floating-point"),
                                         ((torch.zeros(2, 4), torch.float16), "not torch.float16")])
def test_bad_input_is_named(bad, message):
    with pytest.raises(ValueError, match=message):
        quantize_per_token(*bad)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.int8, FP8_DTYPE])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,k", [(1, 3584), (17, 4608), (300, 18944), (4096, 3584)])
def test_kernel_matches_reference_on_cuda(dtype, x_dtype, m, k):
    x2 = _rows(m, k, x_dtype, seed=m + k).cuda()
    _assert_same_as_reference(x2, dtype, quantize_per_token(x2, dtype))
    strided = _rows(m, 2 * k, x_dtype, seed=m).cuda()[:, ::2]
    _assert_same_as_reference(strided, dtype, quantize_per_token(strided, dtype))
