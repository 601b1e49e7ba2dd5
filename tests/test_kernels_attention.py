"""Triton paged attention against the torch reference, on random inputs.

Without CUDA the kernels run in Triton's interpreter (fp16/fp32, small shapes: the interpreter's bf16
dot is wrong). ``cuda``-marked tests cover bf16, every block size, head_dim 64/128 and long contexts.
"""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from attention_cases import DEVICE, F8, I8, MIXED, QUANT_LAYOUTS, check, make_case  # noqa: E402
from nanocore.interfaces import KVLayout  # noqa: E402
from nanocore.kernels.paged_attention import AttentionConfig, paged_attention  # noqa: E402
from nanocore.layers.attention import AttentionMetadata, paged_attention_reference  # noqa: E402



@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("config", [None, AttentionConfig(64, 32, 4, 1)])
def test_mixed_batch_gqa(block_size, config):
    q, cache, meta = make_case(MIXED, 4, 2, 64, block_size, torch.float16, pad_tokens=2)
    check(q, cache, meta, config=config)


def test_fp32_mha_chunk_against_prefix():
    q, cache, meta = make_case([(20, 50), (7, 7)], 2, 2, 64, 16, torch.float32)
    check(q, cache, meta, tol=1e-5)


def test_forced_split_kv_decode():
    q, cache, meta = make_case([(1, 150), (1, 9), (1, 64)], 4, 1, 64, 16, torch.float16)
    check(q, cache, meta, config=AttentionConfig(16, 16, 4, 1, num_splits=4))
    check(q, cache, meta, config=AttentionConfig(16, 32, 4, 1, num_splits=8))  # more splits than tiles


def test_non_power_of_two_head_dim_and_group():
    q, cache, meta = make_case([(4, 30), (1, 17)], 6, 2, 48, 16, torch.float16)
    check(q, cache, meta)


def test_no_cache_prefill():
    torch.manual_seed(1)
    lens = [9, 1, 30]
    meta = AttentionMetadata.for_prefill(lens, device=DEVICE)
    q = torch.randn(sum(lens), 4, 64, device=DEVICE).half()
    k = torch.randn(sum(lens), 2, 64, device=DEVICE).half()
    v = torch.randn(sum(lens), 2, 64, device=DEVICE).half()
    out = paged_attention(q, k, v, None, meta, 0.125)
    ref = paged_attention_reference(q, k, v, None, meta, 0.125)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


@pytest.mark.parametrize("layout", [
    KVLayout(torch.int8, torch.int8, "token_head", "token_head"),
    KVLayout(torch.int8, torch.int8, "group", "token_head", group_size=16),
])
def test_quantized_layouts(layout):
    q, cache, meta = make_case(MIXED[:3], 4, 2, 64, 16, torch.float16, layout=layout)
    check(q, cache, meta, layout=layout)


QUANT_PATHS = ["fold", "fp16_hwcvt"]


@pytest.mark.parametrize("path", QUANT_PATHS)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("name", list(QUANT_LAYOUTS))
def test_quantized_paths_mixed(name, block_size, path):
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case(MIXED, 4, 2, 64, block_size, torch.float16, layout=layout, pad_tokens=1)
    check(q, cache, meta, layout=layout, config=AttentionConfig(32, 32, 4, 1, quant_path=path))


@pytest.mark.parametrize("path", QUANT_PATHS)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("name", list(QUANT_LAYOUTS))
def test_quantized_paths_split_decode(name, block_size, path):
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case([(1, 150), (1, 9), (1, 64), (1, 1)], 4, 1, 64, block_size, torch.float16,
                               layout=layout, seed=3)
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, 16, 4, 1, num_splits=4, quant_path=path))
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, 64, 4, 1, num_splits=1, quant_path=path))


@pytest.mark.parametrize("path", QUANT_PATHS)
@pytest.mark.parametrize("name", ["int8", "k_int8_v_fp8"])
def test_quantized_paths_fp32_tight(name, path):
    """fp32 queries: the folded scales must give the dequantized result to rounding."""
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case([(6, 40), (1, 33)], 4, 2, 64, 16, torch.float32, layout=layout)
    check(q, cache, meta, layout=layout, config=AttentionConfig(32, 16, 4, 1, quant_path=path), tol=1e-5)


@pytest.mark.parametrize("path", QUANT_PATHS)
@pytest.mark.parametrize("layout", [
    KVLayout(I8, I8, "token_head", "token_head"),
    KVLayout(I8, F8, "group", "token_head", group_size=16),  # 3 groups over head_dim 48 (padded to 64)
    KVLayout(I8, I8, "group", "token_head", group_size=8),  # too narrow to split: K dequantized
])
def test_quantized_paths_odd_shapes(layout, path):
    q, cache, meta = make_case([(4, 30), (1, 17)], 6, 2, 48, 16, torch.float16, layout=layout)
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, 16, 4, 1, quant_path=path))
    check(q, cache, meta, layout=layout)  # default config and path


def test_fp16_path_applies_only_where_it_can():
    """One-byte K and V, 16-bit queries, K groups of 16+ (power of two); else the kernel takes "fold"."""
    from nanocore.kernels.narrow_attention import narrow_constexprs

    def args(layout, q_dtype=torch.float16, kv_heads=2, head_dim=64, path="fp16_hwcvt"):
        q, cache, meta = make_case([(1, 20)], 2 * kv_heads, kv_heads, head_dim, 16, torch.float16, layout=layout)
        from nanocore.kernels.paged_attention import _layout_args
        k, v, ks, vs, codes, groups, _ = _layout_args(cache, layout, q, q)
        return narrow_constexprs(path, q.to(q_dtype), k, v, ks, vs, codes, groups[0], head_dim)

    kv = args(QUANT_LAYOUTS["k_int8_v_fp8"])
    assert kv["NARROW"] and kv["KS_HALVES"] and kv["VS_HALVES"] and kv["KS_NUM_PAD"] == 2
    assert kv["KS_ROW"] == 2 * 2 // 2 and kv["VS_ROW"] == 2 // 2  # int32 words per slot
    assert not args(QUANT_LAYOUTS["int8"], q_dtype=torch.float32)["NARROW"]
    assert not args(QUANT_LAYOUTS["int8"], path="fold")["NARROW"]
    assert not args(KVLayout(I8, I8, "group", "token_head", group_size=8))["NARROW"]
    assert not args(None)["NARROW"]  # a 16-bit cache
    odd = args(QUANT_LAYOUTS["k_int8_v_fp8"], kv_heads=1)  # fp16 V scales of one head: no whole words
    assert odd["NARROW"] and not odd["VS_HALVES"] and odd["KS_HALVES"]
