"""The CUDA C++ AWQ GEMV: its arithmetic emulated in torch (CPU), its launch plan, its build, and the kernel itself
against the torch twin on the GPU (every M, dtype, plan, bias, split tails, CUDA-graph replay)."""
import pytest
import torch

from nanocore.toolkit.cuda_library import nvcc_path
from nanocore.toolkit.numerics import awq_pack
from nanocore_awq.gemv_cuda import GEMV_MAX_M, SOURCES, GemvPlan, gemv_plan
from nanocore_awq.kernels import awq_linear_torch

COLUMN_OF_NIBBLE = [0, 2, 4, 6, 1, 3, 5, 7]


def gemv_emulated(x, qweight, qzeros, scales, rows_per_split=None):
    """The kernel's arithmetic in float32 torch: nibbles widened to 1 + q * 2^-8 / 1 + q * 2^-4 by bit operations,
    sums of x * v per piece of a group inside one split, then s * ((acc - sum x) * 2^p - z * sum x) per piece."""
    (m, k), n = x.shape, scales.shape[1]
    groups = scales.shape[0]
    g = k // groups
    shifts = torch.tensor([15, 7, -1, -9])  # w << 15, w << 7, w >> 1, w >> 9 -> (even nibble, odd nibble) pairs
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    values = torch.empty(k, n // 8, 8, dtype=torch.float32)
    for j, sh in enumerate(shifts.tolist()):
        t = ((w << sh) if sh > 0 else (w >> -sh)) & 0xFFFFFFFF
        for odd, mask in ((0, 0x00078000), (1, 0x00780000)):
            bits = ((t & mask) | 0x3F800000).to(torch.int32)
            values[:, :, COLUMN_OF_NIBBLE[2 * j + odd]] = bits.view(torch.float32)
    values = values.reshape(k, n)
    nibble_of = torch.tensor([COLUMN_OF_NIBBLE.index(c) for c in range(8)])
    unit = torch.where(nibble_of % 2 == 0, 256.0, 16.0).repeat(n // 8)  # even nibbles sat at bits 15-18
    zeros = torch.stack([(qzeros.to(torch.int64) >> (4 * i)) & 0xF for i in range(8)], -1)
    zeros = zeros[..., nibble_of].reshape(groups, n).float()
    total = torch.zeros(m, n)
    cuts = sorted(set(range(0, k, g)) | set(range(0, k, rows_per_split or g)) | {k})
    for a, b in zip(cuts[:-1], cuts[1:]):  # pieces: a group, or the part of it one split holds
        gi = a // g
        xs = x[:, a:b].float()
        acc, sx = xs @ values[a:b], xs.sum(1, keepdim=True)
        total += scales[gi].float() * ((acc - sx) * unit - zeros[gi] * sx)
    return total


@pytest.mark.parametrize("m,n,k,group,rows", [(1, 64, 256, 128, None), (3, 40, 128, 32, 16), (4, 24, 384, 64, 48),
                                              (2, 16, 512, 128, 96)])
def test_kernel_arithmetic_matches_the_twin(m, n, k, group, rows):
    torch.manual_seed(m * 7 + n)
    packed = awq_pack(torch.randn(n, k), group)
    x = torch.randn(m, k)
    expected = awq_linear_torch(x, packed["qweight"], packed["qzeros"], packed["scales"].float())
    got = gemv_emulated(x, packed["qweight"], packed["qzeros"], packed["scales"], rows)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-4  # bf16 rounds at 4e-3


def test_emulation_catches_a_wrong_column_order():
    torch.manual_seed(0)
    packed = awq_pack(torch.randn(16, 128), 128)
    x = torch.randn(1, 128)
    expected = awq_linear_torch(x, packed["qweight"], packed["qzeros"], packed["scales"].float())
    COLUMN_OF_NIBBLE.reverse()
    try:
        got = gemv_emulated(x, packed["qweight"], packed["qzeros"], packed["scales"])
    finally:
        COLUMN_OF_NIBBLE.reverse()
    assert float((got - expected).abs().max() / expected.abs().max()) > 0.05


def test_plan_fills_the_gpu_and_keeps_loads_aligned():
    # Qwen2.5-7B at M = 1..4 on 132 SMs: >= 4 blocks per SM (or the shortest split), words dividing the row
    for n, k in [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)]:
        for m in range(1, GEMV_MAX_M + 1):
            plan = gemv_plan(n, k, 132)
            assert (n // 8) % plan.words == 0 and plan.words * m <= 4 and plan.rows_per_split % 16 == 0
            blocks = -(-(n // 8) // (plan.words * 128)) * -(-k // plan.rows_per_split)
            assert blocks >= 4 * 132 or plan.rows_per_split == 64
            assert plan.rows_per_split == 1024 or blocks < 8 * 132  # and no shorter than that needs
    # the H200 sweep's best (or within 3%) for these shapes at M = 1
    assert gemv_plan(37888, 3584, 132) == GemvPlan(1, 128)
    assert gemv_plan(4608, 3584, 132) == GemvPlan(1, 64)  # narrow rows: short splits, many blocks
    assert gemv_plan(37888, 3584, 8).rows_per_split == 1024  # few SMs: long splits, few split sums


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc (the CUDA toolkit) to compile the kernel")
def test_kernel_source_compiles(tmp_path, monkeypatch):
    from nanocore.toolkit.cuda_library import arch_flags, load_cuda_library
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path))
    lib = load_cuda_library("nanocore_awq_gemv", SOURCES, arch_flags((9, 0)))
    assert hasattr(lib, "nanocore_awq_gemv")


def _cuda_case(m, n, k, group, dtype, with_bias, seed=0):
    torch.manual_seed(seed)
    packed = {name: t.cuda() for name, t in awq_pack(torch.randn(n, k), group, dtype).items()}
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if with_bias else None
    expected = awq_linear_torch(x.float(), packed["qweight"], packed["qzeros"], packed["scales"].float(),
                                None if bias is None else bias.float())
    return packed, x, bias, expected


def _close(got, expected, tol=1e-2):
    return float((got.float() - expected).abs().max() / expected.abs().max()) < tol


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_twin_on_cuda(m, dtype, with_bias):
    from nanocore_awq.gemv_cuda import awq_gemv_cuda, gemv_reason
    assert gemv_reason(torch.device("cuda")) is None
    packed, x, bias, expected = _cuda_case(m, 1536, 1280, 128, dtype, with_bias, seed=m)
    plans = [None, GemvPlan(1, 128), GemvPlan(1, 48), GemvPlan(2, 16)] + ([GemvPlan(4, 384)] if m == 1 else [])
    for plan in plans:  # K = 1,280: 48-row splits end inside groups, 384-row splits leave a short last one
        if plan is not None and plan.words * m > 4:
            continue
        for _ in range(2):  # the second call checks that the split counters were reset
            assert _close(awq_gemv_cuda(x, **packed, bias=bias, plan=plan), expected), plan


@pytest.mark.cuda
@pytest.mark.parametrize("n,k", [(4608, 3584), (3584, 18944)])
def test_gemv_on_qwen_shapes_and_graph_replay(n, k):
    from nanocore_awq.gemv_cuda import awq_gemv_cuda
    packed, x, _, expected = _cuda_case(1, n, k, 128, torch.bfloat16, False)
    graph = torch.cuda.CUDAGraph()
    awq_gemv_cuda(x, **packed)  # eager first: allocates the split counters
    with torch.cuda.graph(graph):
        y = awq_gemv_cuda(x, **packed)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert _close(y, expected)


@pytest.mark.cuda
def test_method_dispatch_runs_the_gemv_for_small_m_and_triton_beyond():
    from nanocore_awq.kernels import run_awq_kernel
    packed, x, _, expected = _cuda_case(4, 512, 1024, 128, torch.bfloat16, False)
    assert _close(run_awq_kernel("cuda", "awq", x, **packed), expected)
    packed, x, _, expected = _cuda_case(9, 512, 1024, 128, torch.bfloat16, False)
    assert _close(run_awq_kernel("cuda", "awq", x, **packed), expected)


def test_kernel_option_choices_on_cpu():
    from nanocore_awq import AWQLinearMethod
    from nanocore_awq.kernels import run_awq_kernel
    packed = awq_pack(torch.randn(16, 128), 128)
    x = torch.randn(2, 128)
    with pytest.raises(RuntimeError, match="kernel='cuda' needs a CUDA GPU"):
        run_awq_kernel("cuda", "awq", x, **packed)
    expected = awq_linear_torch(x, packed["qweight"], packed["qzeros"], packed["scales"])
    torch.testing.assert_close(run_awq_kernel("auto", "awq", x, **packed), expected)
    assert AWQLinearMethod({"kernel": "cuda"}).kernel == "cuda"
    with pytest.raises(ValueError, match="cuda"):
        AWQLinearMethod({"kernel": "cutlass"})
