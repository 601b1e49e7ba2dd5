"""The CUDA-core one-byte decode kernel (``narrow_decode_kernel``, quant path "cuda_core") against the torch
reference: every scaled layout, GQA groups that are and are not powers of two, tiles, splits, page sizes, padded
sequences; batches it does not cover fall back to the tensor-core kernel. CPU interpreter here, cuda on the GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from attention_cases import DEVICE, QUANT_LAYOUTS, check, make_case  # noqa: E402
from nanocore.kernels.paged_attention import AttentionConfig  # noqa: E402

DECODES = [(1, 150), (1, 9), (0, 20), (1, 64), (1, 1), (1, 33)]  # (query_len, seq_len); 0: a padded sequence


@pytest.fixture
def launches(monkeypatch):
    """Counts launches of the CUDA-core kernel, so a test knows which kernel produced its result."""
    from nanocore.kernels import paged_attention as pa
    calls = []
    real = pa.narrow_decode
    monkeypatch.setattr(pa, "narrow_decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def cuda_core(block_n=16, warps=1, splits=0, stages=1):
    """The CUDA-core kernel's config (``stages`` is not read by the kernel: any value gives the same launch)."""
    return AttentionConfig(16, block_n, warps, stages, num_splits=splits, quant_path="cuda_core")


@pytest.mark.parametrize("name", list(QUANT_LAYOUTS))
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2), (6, 2), (7, 1)])
def test_decode_layouts_and_groups(name, heads, kv_heads, launches):
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case(DECODES, heads, kv_heads, 64, 16, torch.bfloat16, layout=layout, seed=heads)
    check(q, cache, meta, layout=layout, config=cuda_core())
    assert launches == [1]


@pytest.mark.parametrize("block_n,warps,splits,stages", [(32, 1, 1, 1), (16, 2, 4, 2), (64, 4, 3, 1), (8, 1, 16, 2)])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("name", ["int8", "k_int8_v_fp8"])
def test_decode_tiles_splits_pages(name, block_n, warps, splits, stages, block_size, launches):
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case(DECODES, 4, 2, 64, block_size, torch.float16, layout=layout, seed=block_n)
    check(q, cache, meta, layout=layout, config=cuda_core(block_n, warps, splits, stages))
    assert launches == [1]


@pytest.mark.parametrize("head_dim,dtype,specs", [
    (48, torch.float16, DECODES),  # head_dim not a power of two
    (64, torch.float32, DECODES),  # fp32 queries: no fp16 path
    (64, torch.float16, [(3, 40), (1, 20)]),  # a chunk of 3 tokens: not a pure decode step
])
def test_uncovered_batches_fall_back(head_dim, dtype, specs, launches):
    layout = QUANT_LAYOUTS["int8"]
    q, cache, meta = make_case(specs, 4, 2, head_dim, 16, dtype, layout=layout)
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, 16, 4, 1, quant_path="cuda_core"))
    assert launches == []


def test_covers():
    from nanocore.kernels.narrow_decode import covers
    on = dict(NARROW=True, WORDS=0)
    assert covers(on, 128, (1, 1), 1, 1) and covers(on, 128, (2, 1), 32, 1)
    assert not covers(on, 128, (1, 1), 1, 2)  # a chunk of 2 tokens
    assert not covers(on, 96, (1, 1), 1, 1)  # head_dim
    assert not covers(on, 128, (2, 1), 256, 1)  # one K scale group per head: NUM_G 0.5 is no tile
    assert not covers(dict(NARROW=False, WORDS=0), 128, (1, 1), 1, 1)
    assert not covers(dict(NARROW=True, WORDS=1), 128, (1, 1), 1, 1)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["int8", "fp8", "k_int8_v_fp8", "fp8_noscale"])
@pytest.mark.parametrize("heads,kv_heads", [(16, 8), (28, 4), (32, 8)])
def test_decode_cuda_model_shapes(name, heads, kv_heads, launches):
    layout = QUANT_LAYOUTS[name]
    specs = [(1, 1 + (977 * i) % 3001) for i in range(24)] + [(0, 5)]
    q, cache, meta = make_case(specs, heads, kv_heads, 128, 16, torch.bfloat16, layout=layout)
    for cfg in (cuda_core(16, 1), cuda_core(8, 1, stages=2), cuda_core(32, 4, 8)):
        check(q, cache, meta, layout=layout, config=cfg)
    assert len(launches) == 3


@pytest.mark.parametrize("name,config", [
    (None, AttentionConfig(16, 16, 4, 1, heads_first=True)),  # the bf16 cache's tile
    ("int8", AttentionConfig(16, 16, 1, 1, num_splits=4, quant_path="fp16_hwcvt", heads_first=True)),
    ("k_int8_v_fp8", AttentionConfig(16, 16, 1, 1, num_splits=2, quant_path="cuda_core", heads_first=True)),
])
def test_heads_first_grid_order(name, config, launches):
    """Decode grids with the KV heads on grid axis 0 give the same result (both kernels, split or not)."""
    layout = QUANT_LAYOUTS[name] if name else None
    # float16: the Triton 3.9 interpreter returns garbage for a bf16 16-bit cache (not on the GPU)
    q, cache, meta = make_case(DECODES, 6, 3, 64, 16, torch.float16, layout=layout, seed=5)
    check(q, cache, meta, layout=layout, config=config)
    assert len(launches) == (config.quant_path == "cuda_core")


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["fp8", "k_int8_v_fp8"])
def test_decode_cuda_fp8_bit_trick_units(name, monkeypatch, launches):
    """Without the hardware e4m3 conversion (CVT 1) fp8 comes out divided by 256: the kernel folds the unit into q
    (K) and the output (V). The H200 converts in hardware, so this path runs only when forced."""
    from nanocore.kernels import narrow_attention
    monkeypatch.setattr(narrow_attention, "converts_fp8", lambda device: False)
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case([(1, 1 + 37 * i) for i in range(20)], 16, 8, 128, 16, torch.bfloat16, layout=layout)
    check(q, cache, meta, layout=layout, config=cuda_core(16, 1, 4))
    assert launches == [1]
