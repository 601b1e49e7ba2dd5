"""The fp8 torch twin; the core's quant_gemm variants (split-K, tiled, int8 x int8) in the interpreter and on CUDA.

The default configs are also tested in the core (tests/test_quant_gemm.py).
"""
import os

import pytest
import torch

from nanocore.toolkit.numerics import FP8_MAX, quantize_fp8_per_row, quantize_int8_per_row
from nanocore_fp8.kernels import fp8_linear_torch


def test_torch_twin_is_dequantize_then_linear():
    w = torch.randn(24, 40)
    q, scale = quantize_fp8_per_row(w)
    x = torch.randn(3, 40)
    expected = x @ (q.float() * scale).t()
    torch.testing.assert_close(fp8_linear_torch(x, q, scale), expected, rtol=1e-5, atol=1e-5)
    assert float(q.float().abs().max()) == FP8_MAX  # each row's largest weight uses the full e4m3 range


interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton interpreter runs only without CUDA (see the root conftest.py)")


def _interpreter_configs():
    from nanocore.toolkit.gemm import GemmConfig
    return [GemmConfig("splitk", 1, 16, 32, 3), GemmConfig("splitk", 2, 8, 64, 2), GemmConfig("splitk", 16, 16, 32, 4),
            GemmConfig("splitk", 16, 32, 64, 1), GemmConfig("tiled", 16, 16, 32), GemmConfig("tiled", 32, 32, 16)]


@interpreter
@pytest.mark.parametrize("m,n,k", [(1, 40, 200), (2, 33, 130), (13, 24, 96), (20, 48, 160)])
@pytest.mark.parametrize("quantize", [quantize_fp8_per_row, quantize_int8_per_row])
def test_kernel_variants_match_twin_in_triton_interpreter(m, n, k, quantize):
    from nanocore.toolkit import gemm as quant_gemm
    from nanocore.toolkit.gemm import SPLITK_MAX_M, weight_only_linear, weight_only_linear_torch
    torch.manual_seed(m * 1000 + n)
    q, scale = quantize(torch.randn(n, k) * 0.3)
    x, bias = torch.randn(m, k), torch.randn(n)
    expected = weight_only_linear_torch(x, q, scale, bias)
    for cfg in _interpreter_configs():
        if cfg.kind == "splitk" and (cfg.block_m < min(m, 16) or m > SPLITK_MAX_M):
            continue  # block_m=1 serves M=1 only; split-K serves M <= 32 (one row tile)
        for _ in range(2):  # the second call checks that the split-K counters were reset
            got = weight_only_linear(x, q, scale, bias, cfg)
        assert float((got - expected).abs().max() / expected.abs().max()) <= 2e-5, cfg
    assert not any(int(t.abs().sum()) for t in quant_gemm._LOCKS.values()), "split-K counters not reset to zero"


@interpreter
@pytest.mark.parametrize("m,n,k", [(17, 24, 64), (40, 40, 96)])
def test_int8_x_int8_in_triton_interpreter(m, n, k):
    from nanocore.toolkit.gemm import GemmConfig, int8_scaled_linear
    torch.manual_seed(m)
    w, ws = quantize_int8_per_row(torch.randn(n, k))
    xq, xs = quantize_int8_per_row(torch.randn(m, k))
    bias = torch.randn(n)
    got = int8_scaled_linear(xq, xs, w, ws, bias, torch.float32, GemmConfig("tiled", 16, 16, 32))
    expected = (xq.double() @ w.double().t()).float() * xs * ws.view(1, -1) + bias
    assert float((got - expected).abs().max() / expected.abs().max()) <= 1e-5


def _launch_variants():
    """(M = 1 variants, M > 1 variants): every launch shape the weight-only kernels were timed over."""
    from nanocore.toolkit.gemm import GemmConfig as S
    gemv = [S("gemv", 1, bn, bk, sk, w, st, reduce_late=late) for bn, bk, sk, w, st, late in [
        (16, 512, 0, 4, 1, True), (16, 512, 0, 4, 3, True), (8, 512, 0, 2, 1, False), (16, 256, 0, 2, 1, False),
        (32, 512, 0, 8, 1, False), (16, 512, 2, 4, 1, False), (32, 256, 0, 4, 1, False), (16, 512, 0, 8, 1, False)]]
    gemv.append(S("gemv", 1, 16, 512, 0, 4, 1, reduce_late=True, int8_magic=False))  # the plain int-to-float path
    splitk = [S("splitk", 16, bn, bk, sk, w, st) for bn, bk, sk, w, st in [
        (32, 256, 0, 4, 3), (32, 256, 0, 4, 5), (32, 512, 0, 4, 4), (64, 256, 0, 4, 4)]]
    tiled = [S("tiled", bm, bn, bk, 0, w, st) for bm, bn, bk, w, st in [
        (16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3),
        (128, 64, 128, 4, 4)]]
    return gemv, splitk + tiled


@pytest.mark.cuda
@pytest.mark.parametrize("quantize", [quantize_fp8_per_row, quantize_int8_per_row])
@pytest.mark.parametrize("native", [True, False])
def test_every_launch_variant_on_cuda(quantize, native):
    import dataclasses

    from nanocore.toolkit.gemm import weight_only_linear, weight_only_linear_torch
    torch.manual_seed(0)
    q, scale = quantize(torch.randn(384, 1024, device="cuda"))
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    m1, larger = _launch_variants()
    tiled = [c for c in larger if c.kind == "tiled"]  # split-K is the decode kernel (M <= 16)
    for m, configs in [(1, m1), (5, larger), (16, larger), (100, tiled)]:
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        expected = weight_only_linear_torch(x.float(), q, scale, bias.float())
        for cfg in configs:
            cfg = dataclasses.replace(cfg, fp8_native=native)
            for _ in range(2):  # split-K counters must be back at zero for the second call
                got = weight_only_linear(x, q, scale, bias, cfg).float()
            err = float((got - expected).abs().max() / expected.abs().max())
            assert err < 1e-2, (m, cfg, err)


@pytest.mark.cuda
def test_int8_x_int8_on_cuda():
    from nanocore.toolkit.gemm import int8_scaled_linear
    _, configs = _launch_variants()
    w, ws = quantize_int8_per_row(torch.randn(256, 512, device="cuda"))
    for m in (17, 300):
        xq, xs = quantize_int8_per_row(torch.randn(m, 512, device="cuda"))
        expected = (xq.double() @ w.double().t()).float() * xs * ws.view(1, -1)
        for cfg in [None] + [c for c in configs if c.kind == "tiled"]:
            got = int8_scaled_linear(xq, xs, w, ws, None, torch.bfloat16, cfg).float()
            assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2, cfg


@pytest.mark.cuda
def test_split_k_decode_replays_in_a_cuda_graph():
    from nanocore.toolkit.gemm import GemmConfig, weight_only_linear, weight_only_linear_torch
    q, scale = quantize_fp8_per_row(torch.randn(512, 2048, device="cuda"))
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    cfg = GemmConfig("splitk", 1, 32, 256, split_k=4)
    weight_only_linear(x, q, scale, None, cfg)  # eager first: allocates the split-K counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = weight_only_linear(x, q, scale, None, cfg)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        expected = weight_only_linear_torch(x.float(), q, scale)
        assert float((y.float() - expected).abs().max() / expected.abs().max()) < 1e-2
