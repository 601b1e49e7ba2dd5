"""Triton paged attention on the GPU against the torch reference: bf16, every block size, head_dim 64/128, long
contexts, every quantized layout and path, decode tiles, CUDA-graph capture. Skips without CUDA."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from attention_cases import CUDA_SCALED_LAYOUTS, QUANT_LAYOUTS, check, make_case  # noqa: E402
from nanocore.kernels.paged_attention import AttentionConfig, paged_attention  # noqa: E402
from nanocore.layers.attention import AttentionMetadata, paged_attention_reference  # noqa: E402


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(16, 8), (9, 3), (8, 8), (32, 4)])
def test_cuda_mixed_bf16(block_size, head_dim, heads):
    specs = [(300, 1000), (1, 2048), (0, 5), (128, 128), (1, 1), (17, 4000), (1, 513)]
    q, cache, meta = make_case(specs, *heads, head_dim, block_size, torch.bfloat16, pad_tokens=3)
    check(q, cache, meta)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("splits", [0, 1, 7, 16])
def test_cuda_long_decode(block_size, splits):
    specs = [(1, 8192), (1, 3), (1, 16384), (1, 4097)]
    q, cache, meta = make_case(specs, 16, 8, 128, block_size, torch.bfloat16)
    cfg = AttentionConfig(16, 64, 4, 3, num_splits=splits) if splits else None
    check(q, cache, meta, config=cfg)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("layout", CUDA_SCALED_LAYOUTS + [QUANT_LAYOUTS["fp8_noscale"]])
@pytest.mark.parametrize("specs", [[(1, 3000), (1, 70), (1, 1)], [(200, 700), (1, 40), (64, 64)]])
def test_cuda_quantized_layouts(layout, specs):
    q, cache, meta = make_case(specs, 16, 8, 128, 16, torch.bfloat16, layout=layout)
    check(q, cache, meta, layout=layout)


@pytest.mark.cuda
@cuda
def test_cuda_plain_prefill_no_cache_and_fp16():
    lens = [1024, 77, 1]
    meta = AttentionMetadata.for_prefill(lens, device="cuda")
    q = torch.randn(sum(lens), 16, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(sum(lens), 8, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(sum(lens), 8, 128, device="cuda", dtype=torch.float16)
    out = paged_attention(q, k, v, None, meta, 0.088)
    ref = paged_attention_reference(q, k, v, None, meta, 0.088)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


@pytest.mark.cuda
@cuda
def test_cuda_graph_capture_replays_new_inputs():
    specs = [(1, 5000), (1, 300), (1, 17)]
    q, cache, meta = make_case(specs, 16, 8, 128, 16, torch.bfloat16)
    paged_attention(q, q, q, cache, meta, 0.1)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention(q, q, q, cache, meta, 0.1)
    q.copy_(torch.randn_like(q))
    meta.seq_lens.copy_(torch.tensor([4000, 301, 2], dtype=torch.int32))
    meta.seq_lens_cpu = [4000, 301, 2]
    graph.replay()
    ref = paged_attention_reference(q, q, q, cache, meta, 0.1)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


#: On the GPU the fp16 path converts fp8 in hardware (sm_89+); "fp16_hwcvt|bits" runs the integer bit tricks a GPU
#: without that instruction takes.
CUDA_QUANT_PATHS = ["fold", "fp16_hwcvt", "fp16_hwcvt|bits"]


def _path(path: str, monkeypatch) -> str:
    """The quant path of a test id; "|bits" makes this GPU convert fp8 as one before sm_89 does."""
    if path.endswith("|bits"):
        from nanocore.kernels import narrow_attention
        monkeypatch.setattr(narrow_attention, "converts_fp8", lambda device: False)
    return path.removesuffix("|bits")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("path", CUDA_QUANT_PATHS)
@pytest.mark.parametrize("name", ["int8", "fp8", "k_int8_v_fp8", "k_int8_g16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("specs", [[(1, 3000), (1, 70), (1, 1), (1, 4097)], [(200, 700), (1, 40), (64, 64), (0, 9)]])
def test_cuda_quantized_paths(specs, block_size, name, path, monkeypatch):
    layout, path = QUANT_LAYOUTS[name], _path(path, monkeypatch)
    q, cache, meta = make_case(specs, 16, 8, 128, block_size, torch.bfloat16, layout=layout, pad_tokens=2)
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, 64, 4, 2, quant_path=path)
          if specs[0][0] == 1 else AttentionConfig(64, 32, 4, 3, quant_path=path))
    check(q, cache, meta, layout=layout)  # default config and path


FOLD_TILES = [(32, 4, 2, 0), (64, 4, 3, 0), (128, 4, 2, 0), (128, 8, 2, 0), (128, 4, 3, 0), (64, 8, 2, 0),
              (64, 4, 2, 7), (128, 4, 2, 16)]
FP16_TILES = [(128, 4, 2, 0), (64, 2, 2, 0), (64, 4, 2, 7), (32, 4, 2, 16)]  # attention_quant_tune checks the rest


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("path,tile", [("fold", t) for t in FOLD_TILES] + [("fp16_hwcvt", t) for t in FP16_TILES])
@pytest.mark.parametrize("name", ["int8", "fp8", "k_int8_v_fp8"])
def test_cuda_quantized_decode_tiles(tile, name, path):
    """Tiles the microbenches time, split-KV forced too, on long decodes."""
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case([(1, 8192), (1, 3), (1, 5000)], 16, 8, 128, 16, torch.bfloat16, layout=layout)
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, *tile, quant_path=path))


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("name", ["int8", "fp8", "k_int8_v_fp8"])
def test_cuda_fp16_path_is_at_least_as_accurate_as_fold(name):
    """fp16 keeps 3 more mantissa bits than bf16 for the probabilities: its error must not be larger."""
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case([(1, 4000), (1, 900), (1, 33)], 16, 8, 128, 16, torch.bfloat16, layout=layout)
    ref = paged_attention_reference(q, q, q, cache, meta, 0.088).float()
    errs = {}
    for path in CUDA_QUANT_PATHS:
        with pytest.MonkeyPatch.context() as patch:
            config = AttentionConfig(16, 128, 4, 2, quant_path=_path(path, patch))
            out = paged_attention(q, q, q, cache, meta, 0.088, layout=layout, config=config).float()
        meta.launch_choices.clear()  # the conversion is part of the memoised launch plan
        errs[path] = ((out - ref).norm() / ref.norm()).item()
    assert errs["fp16_hwcvt"] <= errs["fold"] * 1.1 and errs["fp16_hwcvt|bits"] <= errs["fold"] * 1.1, errs
