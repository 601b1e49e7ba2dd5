"""AWQ Triton kernels vs the torch twin (interpreter on CPU, bf16 on a GPU); the twin vs AutoAWQ's formula."""
import os

import pytest
import torch

from nanocore.toolkit.numerics import awq_dequantize, awq_pack, pack_int4_awq, unpack_int4_awq
from nanocore_awq.kernels import awq_linear_torch


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton interpreter runs only without CUDA (see the root conftest.py)")
@pytest.mark.parametrize("m,n,k,group", [(1, 40, 128, 128), (3, 16, 256, 128), (8, 72, 64, 32), (9, 24, 256, 128),
                                         (20, 40, 128, 64), (70, 136, 128, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_triton_kernels_match_torch_twin_in_interpreter(m, n, k, group, dtype, with_bias):
    from nanocore.toolkit.gemm import SPLITK_MAX_M, GemmConfig
    from nanocore_awq.kernels import awq_linear_triton
    # None = the default config for the shape; then split-K (FMA and tl.dot) and tiled variants
    configs = [None, GemmConfig("splitk", 1, 16, 32, 2), GemmConfig("splitk", 16, 16, 32, 3),
               GemmConfig("tiled", 16, 32, 32)]
    torch.manual_seed(m * 1000 + n)
    packed = awq_pack(torch.randn(n, k), group)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    expected = awq_linear_torch(x.float(), packed["qweight"], packed["qzeros"], packed["scales"].float(),
                                None if bias is None else bias.float())
    tol = 3e-3 if dtype == torch.float16 else 1e-5
    for cfg in configs:
        if cfg is not None and (cfg.block_m == 1 and m > 1 or dtype == torch.float16
                                or cfg.kind == "splitk" and m > SPLITK_MAX_M):
            continue  # block_m=1 serves M=1 only, split-K M <= 32; variants run in float32 only (interpreter time)
        for _ in range(2):  # the second call checks that the split-K counters were reset
            got = awq_linear_triton(x, packed["qweight"], packed["qzeros"], packed["scales"], bias, cfg).float()
        assert float((got - expected).abs().max() / expected.abs().max()) <= tol, cfg


def test_pack_order_is_autoawq():
    q = torch.arange(8, dtype=torch.int32).view(1, 8)
    packed = pack_int4_awq(q)
    # AutoAWQ puts value ORDER[i] at nibble i, ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
    assert [(int(packed) >> (4 * i)) & 0xF for i in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    q = torch.randint(0, 16, (5, 24), dtype=torch.int32)
    assert torch.equal(unpack_int4_awq(pack_int4_awq(q)), q)


def test_twin_dequantizes_close_to_the_weight():
    w = torch.randn(48, 256)
    packed = awq_pack(w, 128)
    w_t = awq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"]).float()
    span = (w.view(48, 2, 128).amax(-1) - w.view(48, 2, 128).amin(-1)).repeat_interleave(128, 1)
    assert ((w_t.t() - w).abs() <= span / 30 + 2e-3).all()  # half a step of 15 plus fp16 scale rounding
    x = torch.randn(3, 256)
    torch.testing.assert_close(awq_linear_torch(x, **packed), x @ w_t)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 4, 8, 16, 24, 32, 100, 512])
def test_triton_bf16_on_cuda(m):
    from nanocore_awq.kernels import awq_linear_triton
    torch.manual_seed(m)
    packed = {k: v.cuda() for k, v in awq_pack(torch.randn(384, 512), 128, torch.bfloat16).items()}
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    expected = awq_linear_torch(x.float(), packed["qweight"], packed["qzeros"], packed["scales"].float())
    got = awq_linear_triton(x, **packed).float()
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2


#: split-K tiles at M = 1 and 16 (block_n, block_k, split_k, warps), and tensor-core tiles (block_m, block_n,
#: block_k, warps, stages): every launch shape the AWQ kernels were timed over, each held to the twin
AWQ_M1 = [(128, 128, 0, 4), (64, 128, 0, 4), (256, 128, 0, 8), (128, 64, 0, 4), (64, 128, 1, 4), (128, 128, 0, 8),
          (32, 128, 0, 2)]
AWQ_M16 = [(64, 128, 0, 4), (128, 128, 0, 4), (32, 128, 0, 4), (64, 64, 0, 4), (128, 128, 0, 8)]
TILED = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3),
         (128, 64, 128, 4, 4)]


@pytest.mark.cuda
def test_every_launch_variant_on_cuda():
    from nanocore.toolkit.gemm import GemmConfig
    from nanocore_awq.kernels import awq_linear_triton
    m1 = [GemmConfig("splitk", 1, bn, bk, sk, w) for bn, bk, sk, w in AWQ_M1]
    m16 = [GemmConfig("splitk", 16, bn, bk, sk, w) for bn, bk, sk, w in AWQ_M16]
    tiled = [GemmConfig("tiled", bm, bn, bk, 0, w, st) for bm, bn, bk, w, st in TILED]
    torch.manual_seed(0)
    packed = {k: v.cuda() for k, v in awq_pack(torch.randn(512, 1024), 128, torch.bfloat16).items()}
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    for m, configs in [(1, m1 + m16), (5, m16 + tiled), (16, m16 + tiled), (100, tiled)]:
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        expected = awq_linear_torch(x.float(), packed["qweight"], packed["qzeros"], packed["scales"].float(),
                                    bias.float())
        for cfg in configs:
            for _ in range(2):  # split-K counters must be back at zero for the second call
                got = awq_linear_triton(x, **packed, bias=bias, config=cfg).float()
            assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2, (m, cfg)
