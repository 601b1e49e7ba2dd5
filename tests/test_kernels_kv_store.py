"""Fused KV store kernel against its torch twin (interpreter on CPU, compiled on CUDA)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from attention_cases import CUDA_SCALED_LAYOUTS  # noqa: E402
from nanocore.builtin.unquantized_kv import UnquantizedKVCodec  # noqa: E402
from nanocore.interfaces import KVCache, KVLayout  # noqa: E402
from nanocore.kernels.kv_store import quantize_reference, store_kv, store_kv_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def allocate(layout, num_blocks, block_size, num_kv_heads, head_dim, device):
    """A cache for ``layout``, pre-filled with random values so unwritten slots are detectable."""
    def scales(granularity):
        groups = layout.num_scale_groups(granularity, head_dim)
        return torch.rand(num_blocks, block_size, num_kv_heads, groups, device=device) if groups else None
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    fill = {torch.int8: lambda: torch.randint(-100, 100, shape, dtype=torch.int8, device=device)}
    def values(dtype):
        return fill.get(dtype, lambda: torch.randn(shape, device=device).to(dtype))()
    return KVCache(values(layout.k_dtype), values(layout.v_dtype), scales(layout.k_scale), scales(layout.v_scale))


def clone(cache):
    return KVCache(*(t.clone() if t is not None else None for t in (cache.k, cache.v, cache.k_scale, cache.v_scale)))


def run_both(layout, dtype, num_kv_heads=2, head_dim=64, block_size=16, num_tokens=37, device=DEVICE, seed=0):
    torch.manual_seed(seed)
    num_blocks = -(-num_tokens // block_size) + 4
    cache = allocate(layout, num_blocks, block_size, num_kv_heads, head_dim, device)
    twin = clone(cache)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[::5] = -1  # padding tokens
    kv = torch.randn(num_tokens, 2 * num_kv_heads, head_dim, device=device).to(dtype)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads:]  # strided views, as split from a fused qkv
    store_kv(cache, k, v, slots, layout)
    store_kv_reference(twin, k, v, slots, layout)
    return cache, twin


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_unquantized_store_matches_codec(dtype):
    layout = UnquantizedKVCodec().layout(dtype)
    cache, twin = run_both(layout, dtype)
    assert torch.equal(cache.k, twin.k) and torch.equal(cache.v, twin.v)


@pytest.mark.parametrize("layout", [
    KVLayout(torch.int8, torch.int8, "token_head", "token_head"),
    KVLayout(torch.int8, torch.int8, "group", "token_head", group_size=16),
])
def test_int8_store(layout):
    cache, twin = run_both(layout, torch.float16)
    assert torch.equal(cache.k, twin.k) and torch.equal(cache.v, twin.v)  # IEEE division in both
    torch.testing.assert_close(cache.k_scale, twin.k_scale)
    torch.testing.assert_close(cache.v_scale, twin.v_scale)


def test_quantize_reference_round_trip():
    x = torch.randn(5, 3, 64)
    for granularity, group_size in (("token_head", 0), ("group", 16)):
        values, scale = quantize_reference(x, torch.int8, granularity, group_size)
        back = (values.float().view(5, 3, scale.shape[-1], -1) * scale[..., None]).view_as(x)
        assert (back - x).abs().max() <= scale.max() / 2 + 1e-6


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_unquantized_store(dtype, block_size, head_dim):
    layout = UnquantizedKVCodec().layout(dtype)
    cache, twin = run_both(layout, dtype, num_kv_heads=8, head_dim=head_dim, block_size=block_size, num_tokens=300)
    assert torch.equal(cache.k, twin.k) and torch.equal(cache.v, twin.v)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("layout", CUDA_SCALED_LAYOUTS)
def test_cuda_quantized_store(layout):
    cache, twin = run_both(layout, torch.bfloat16, num_kv_heads=8, head_dim=128, num_tokens=300)
    for a, b in ((cache.k, twin.k), (cache.v, twin.v)):
        assert torch.equal(a.view(torch.int8), b.view(torch.int8)), (a.float() - b.float()).abs().max()
    torch.testing.assert_close(cache.k_scale, twin.k_scale)
    torch.testing.assert_close(cache.v_scale, twin.v_scale)


def test_fp16_scales_never_flush_tiny_groups_to_zero():
    """Values are quantized with the scale as stored: a group far below fp16's normal range keeps its values."""
    x = torch.randn(3, 2, 64, dtype=torch.float32) * 1e-6  # amax / 127 is below fp16's smallest subnormal x 2
    values, scale = quantize_reference(x, torch.int8, "group", 32, scale_dtype=torch.float16)
    assert scale.dtype == torch.float16 and bool((scale > 0).all())
    dequant = (values.float().view(3, 2, 2, 32) * scale.float()[..., None]).view_as(x)
    assert (dequant - x).abs().max() <= 0.5 * scale.float().max() + 1e-12
    assert dequant.abs().sum() > 0
