"""nanocore.toolkit.gemm_block (one-byte weights with one scale per tile) vs its torch reference.

Random weights and scales (never zeros), N and K not multiples of the tile, compact tiles and one-scale-row-per-row
layouts, decode (split-K) and prefill (tiled) sizes.
"""
import os

import pytest
import torch

from nanocore.toolkit.gemm_block import (
    block_scale_shape,
    block_scaled_linear_torch,
    dequantize_blocks,
    expand_block_rows,
)
from nanocore.toolkit.numerics import quantize_fp8_blocks

interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton interpreter runs only without CUDA (see conftest.py)")


def _weights(n, k, block, int8=False, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    if int8:
        q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    else:
        q = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(*block_scale_shape(n, k, block), generator=g) * 0.02 + 0.001  # distinct per tile
    return q.to(device), scale.to(device)


def test_reference_is_tilewise_dequantize_then_linear():
    q, scale = _weights(200, 300, (128, 128))
    w = dequantize_blocks(q, scale, (128, 128))
    assert torch.equal(w[130:, 260:], q[130:, 260:].float() * scale[1, 2])  # the partial corner tile
    assert torch.equal(w[:128, :128], q[:128, :128].float() * scale[0, 0])
    x = torch.randn(3, 300)
    torch.testing.assert_close(block_scaled_linear_torch(x, q, scale, (128, 128)), x @ w.t())
    rows = expand_block_rows(scale, 200, 128)  # one scale row per weight row: the same weight
    assert torch.equal(dequantize_blocks(q, rows, (1, 128)), w)


def test_quantize_fp8_blocks_round_trips_within_fp8_rounding():
    w = torch.randn(200, 300)
    w[:128, :128] *= 50  # one loud tile must not coarsen the others
    q, scale = quantize_fp8_blocks(w)
    assert scale.shape == (2, 3) and q.dtype == torch.float8_e4m3fn
    err = (dequantize_blocks(q, scale, (128, 128)) - w).abs()
    assert (err <= w.abs() / 16 + scale.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300] / 8).all()
    assert float(err[128:].max()) < 0.2


def test_wrong_scale_shape_and_untileable_blocks_are_clear_errors():
    from nanocore.toolkit.gemm_block import block_scaled_linear, check_block_scales
    q, scale = _weights(200, 300, (128, 128))
    with pytest.raises(ValueError, match="another block_structure"):
        check_block_scales(q, scale[:1], (128, 128))
    with pytest.raises(ValueError, match="multiple of 16"):
        block_scaled_linear(torch.randn(2, 300), q, _weights(200, 300, (128, 100))[1], (128, 100))


@interpreter
@pytest.mark.parametrize("m,n,k", [(1, 160, 288), (3, 200, 300), (16, 136, 256), (17, 72, 130), (40, 130, 200)])
@pytest.mark.parametrize("block", [(128, 128), (1, 128), (64, 32)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_kernel_matches_torch_reference_in_triton_interpreter(m, n, k, block, dtype):
    from nanocore.toolkit.gemm_block import block_scaled_linear
    q, scale = _weights(n, k, block, seed=m)
    x, bias = torch.randn(m, k).to(dtype), torch.randn(n).to(dtype)
    expected = block_scaled_linear_torch(x.float(), q, scale, block, bias.float())
    got = block_scaled_linear(x, q, scale, block, bias).float()
    tol = 2e-3 if dtype == torch.float16 else 2e-5
    assert float((got - expected).abs().max() / expected.abs().max()) <= tol


@interpreter
@pytest.mark.parametrize("config", [("splitk", 16, 32, 64, 3), ("splitk", 16, 16, 256, 2), ("tiled", 16, 16, 32, 0),
                                    ("tiled", 32, 64, 128, 0), ("gemv", 1, 16, 512, 0)])
def test_explicit_configs_and_int8_weights_in_triton_interpreter(config):
    from nanocore.toolkit import gemm as quant_gemm
    from nanocore.toolkit.gemm import GemmConfig
    from nanocore.toolkit.gemm_block import block_scaled_linear
    kind, block_m, block_n, block_k, split_k = config
    cfg = GemmConfig(kind, block_m, block_n, block_k, split_k)
    for int8 in (False, True):
        q, scale = _weights(150, 330, (128, 128), int8=int8, seed=split_k)
        for m in (1, 9, 20):
            x = torch.randn(m, 330)
            expected = block_scaled_linear_torch(x, q, scale, (128, 128))
            for _ in range(2):  # the second call checks that the split-K counters were reset
                got = block_scaled_linear(x, q, scale, (128, 128), None, cfg)
            assert float((got - expected).abs().max() / expected.abs().max()) <= 2e-5, (cfg, m, int8)
    assert not any(int(t.abs().sum()) for t in quant_gemm._LOCKS.values()), "split-K counters not reset to zero"


@pytest.mark.cuda
@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
@pytest.mark.parametrize("m", [1, 4, 16, 17, 100, 512])
@pytest.mark.parametrize("native", [None, False])
def test_bf16_on_cuda(block, m, native):
    import dataclasses

    from nanocore.toolkit.gemm import default_config
    from nanocore.toolkit.gemm_block import block_scaled_linear
    q, scale = _weights(1000, 1600, block, device="cuda", seed=m)  # 7 full + 1 partial row tiles, 12 + 1 columns
    x = torch.randn(m, 1600, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    expected = block_scaled_linear_torch(x.float(), q, scale, block, bias.float())
    cfg = dataclasses.replace(default_config(m, 1000, 1600), fp8_native=native)
    got = block_scaled_linear(x, q, scale, block, bias, cfg).float()
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2


@pytest.mark.cuda
def test_block_scaled_decode_replays_in_a_cuda_graph():
    from nanocore.toolkit.gemm_block import block_scaled_linear
    q, scale = _weights(576, 1536, (128, 128), device="cuda")
    x = torch.randn(1, 1536, device="cuda", dtype=torch.bfloat16)
    block_scaled_linear(x, q, scale, (128, 128))  # eager first: allocates the split-K counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = block_scaled_linear(x, q, scale, (128, 128))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        expected = block_scaled_linear_torch(x.float(), q, scale, (128, 128))
        assert float((y.float() - expected).abs().max() / expected.abs().max()) < 1e-2
