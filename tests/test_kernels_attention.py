"""Triton paged attention against the torch reference, on random inputs.

Without CUDA the kernels run in Triton's interpreter (fp16/fp32, small shapes: the interpreter's bf16
dot is wrong). ``cuda``-marked tests cover bf16, every block size, head_dim 64/128 and long contexts.
"""

import pytest
import torch

pytest.importorskip("triton")

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec, flat_slots  # noqa: E402
from nanocore.interfaces import KVCodec, KVLayout  # noqa: E402
from nanocore.kernels.paged_attention import AttentionConfig, paged_attention  # noqa: E402
from nanocore.layers.attention import AttentionMetadata, paged_attention_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class ScaledCodec(KVCodec):
    """Test codec: any storage dtype / scale granularity, dequantizing gather as the reference."""

    def __init__(self, layout: KVLayout):
        self._layout = layout

    def layout(self, dtype):
        return self._layout

    def store(self, cache, k, v, slot_mapping):
        raise NotImplementedError

    def gather(self, cache, slots, dtype):
        def deq(values, scales):
            x = flat_slots(values)[slots].float()
            if scales is not None:
                s = flat_slots(scales)[slots].float()
                x = (x.view(*x.shape[:2], s.shape[-1], -1) * s[..., None]).view_as(x)
            return x.to(dtype)
        return deq(cache.k, cache.k_scale), deq(cache.v, cache.v_scale)


def random_values(shape, dtype, device):
    if dtype == torch.int8:
        return torch.randint(-127, 128, shape, dtype=torch.int8, device=device)
    return torch.randn(shape, device=device).clamp(-4, 4).to(dtype)


def make_case(specs, num_heads, num_kv_heads, head_dim, block_size, dtype, layout=None, pad_tokens=0,
              device=DEVICE, seed=0):
    """Random q and paged cache for sequences ``specs = [(query_len, seq_len), ...]``."""
    torch.manual_seed(seed)
    codec = ScaledCodec(layout) if layout is not None else UnquantizedKVCodec()
    blocks_per_seq = [-(-lk // block_size) for _, lk in specs]
    num_blocks = sum(blocks_per_seq) + 3
    cache = codec.allocate(num_blocks, block_size, num_kv_heads, head_dim, dtype, torch.device(device))
    for t in (cache.k, cache.v):
        t.copy_(random_values(t.shape, t.dtype, device))
    for t in (cache.k_scale, cache.v_scale):
        if t is not None:
            t.copy_(torch.rand(t.shape, device=device) * 0.05 + 0.01)
    perm = torch.randperm(num_blocks, device=device).int()  # blocks scattered over the cache
    max_blocks = max(blocks_per_seq) + 2
    block_tables = torch.full((len(specs), max_blocks), 10**6, dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = perm[used:used + n]
        used += n
    query_lens = [lq for lq, _ in specs]
    seq_lens = [lk for _, lk in specs]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    num_tokens = starts[-1] + pad_tokens
    meta = AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        kv_caches=[cache], codec=codec, query_lens_cpu=query_lens, seq_lens_cpu=seq_lens,
    )
    q = torch.randn(num_tokens, num_heads, head_dim, device=device).to(dtype)
    return q, cache, meta


def check(q, cache, meta, layout=None, config=None, tol=1e-2):
    """Every position read from the cache (no k_new / v_new), kernel vs reference."""
    scale = q.shape[-1] ** -0.5
    out = paged_attention(q, None, None, cache, meta, scale, layout=layout, config=config)
    ref = paged_attention_reference(q, None, None, cache, meta, scale)
    n = int(meta.query_start_loc[-1])
    out, ref = out[:n].float(), ref[:n].float()
    assert torch.isfinite(out).all()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < tol, f"relative error {err}"


MIXED = [(5, 40), (1, 70), (0, 20), (16, 16), (1, 1), (3, 33)]


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


I8, F8 = torch.int8, torch.float8_e4m3fn
#: Every scaled layout family: int8 / fp8 per (token, head), group-scaled int8 K (groups of 16 and 32, the
#: latter with fp16 scales and fp8 V as in the ``k_int8_v_fp8`` codec), and fp8 without scales.
QUANT_LAYOUTS = {
    "int8": KVLayout(I8, I8, "token_head", "token_head"),
    "fp8": KVLayout(F8, F8, "token_head", "token_head"),
    "k_int8_g16": KVLayout(I8, I8, "group", "token_head", group_size=16),
    "k_int8_v_fp8": KVLayout(I8, F8, "group", "token_head", group_size=32, scale_dtype=torch.float16),
    "fp8_noscale": KVLayout(F8, F8),
}
QUANT_PATHS = ["dequant", "fold", "fold_kdeq", "fp16", "fp16_vw", "fp16_kvw"]


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


def test_quant_path_flags_and_defaults():
    from nanocore.kernels import paged_attention as pa
    assert pa.DEFAULT_QUANT_PATH in pa.QUANT_PATHS
    assert pa._quant_flags("dequant", (1, 1), 1) == (False, False)
    assert pa._quant_flags("fold", (1, 1), 1) == (True, False)
    assert pa._quant_flags("fold", (2, 1), 32) == (True, True)
    assert pa._quant_flags("fold_kdeq", (2, 1), 32) == (True, False)
    assert pa._quant_flags("fold", (2, 1), 8) == (True, False)
    assert pa._quant_flags("fold", (0, 0), 1) == (False, False)
    with pytest.raises(ValueError):
        pa._quant_flags("fast", (1, 1), 1)
    narrow = pa.default_config(1, 2, 128, kv_itemsize=1)
    assert (narrow.block_n, narrow.num_warps, narrow.num_stages) == pa.NARROW_DECODE_TILE
    assert pa.default_config(1, 2, 128) == pa.default_config(1, 2, 128, kv_itemsize=2)


def test_quant_path_and_decode_tile_overrides(monkeypatch):
    from nanocore.kernels import paged_attention as pa
    monkeypatch.setenv("NANOCORE_ATTN_QUANT_PATH", "fold")
    assert pa.default_quant_path() == "fold"
    grouped = pa.default_config(1, 2, 128, kv_itemsize=1, k_grouped=True)
    assert (grouped.block_n, grouped.num_warps, grouped.num_stages) == pa.GROUP_K_DECODE_TILE  # "fold"'s own tile
    monkeypatch.setenv("NANOCORE_ATTN_DECODE_TILE", "64/2/3")
    assert pa.default_config(1, 2, 128, kv_itemsize=1, k_grouped=True).num_warps == 2
    assert pa.default_config(1, 2, 128).block_n == 64  # a bf16 cache keeps its tile
    assert pa.default_config(3, 2, 128, kv_itemsize=1, k_grouped=True).num_warps == 4  # 2+-token tiles keep theirs
    monkeypatch.setenv("NANOCORE_ATTN_DECODE_TILE", "64x2")
    with pytest.raises(ValueError, match="block_n/num_warps/num_stages"):
        pa.default_config(1, 2, 128, kv_itemsize=1)
    monkeypatch.setenv("NANOCORE_ATTN_QUANT_PATH", "fastest")
    with pytest.raises(ValueError, match="NANOCORE_ATTN_QUANT_PATH"):
        pa.default_quant_path()


def test_fp16_path_applies_only_where_it_can():
    """One-byte K and V, 16-bit queries, K groups of 16+ (power of two); else the kernel takes "fold"."""
    from nanocore.kernels.narrow_attention import narrow_constexprs

    def args(layout, q_dtype=torch.float16, kv_heads=2, head_dim=64, path="fp16_hwcvt_vw"):
        q, cache, meta = make_case([(1, 20)], 2 * kv_heads, kv_heads, head_dim, 16, torch.float16, layout=layout)
        from nanocore.kernels.paged_attention import _layout_args
        k, v, ks, vs, codes, groups, _ = _layout_args(cache, layout, q, q)
        return narrow_constexprs(path, q.to(q_dtype), k, v, ks, vs, codes, groups[0], head_dim)

    kv = args(QUANT_LAYOUTS["k_int8_v_fp8"])
    assert kv["NARROW"] and kv["WORDS"] == 1 and kv["KS_HALVES"] and kv["VS_HALVES"] and kv["KS_NUM_PAD"] == 2
    assert kv["KS_ROW"] == 2 * 2 // 2 and kv["VS_ROW"] == 2 // 2  # int32 words per slot
    assert not args(QUANT_LAYOUTS["int8"], q_dtype=torch.float32)["NARROW"]
    assert not args(QUANT_LAYOUTS["int8"], path="fold")["NARROW"]
    assert not args(KVLayout(I8, I8, "group", "token_head", group_size=8))["NARROW"]
    assert not args(None)["NARROW"]  # a 16-bit cache
    odd = args(QUANT_LAYOUTS["k_int8_v_fp8"], kv_heads=1)  # fp16 V scales of one head: no whole words
    assert odd["NARROW"] and not odd["VS_HALVES"] and odd["KS_HALVES"]
    assert args(QUANT_LAYOUTS["int8"], path="fp16_kvw")["WORDS"] == 2
    assert args(QUANT_LAYOUTS["int8"], path="fp16")["WORDS"] == 0


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
@pytest.mark.parametrize("layout", [
    KVLayout(torch.int8, torch.int8, "token_head", "token_head"),
    KVLayout(torch.float8_e4m3fn, torch.float8_e4m3fn, "token_head", "token_head"),
    KVLayout(torch.int8, torch.int8, "group", "token_head", group_size=32),
    KVLayout(torch.float8_e4m3fn, torch.float8_e4m3fn),
])
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


#: On the GPU the fp16 paths run their bit-trick (``fp16_vw``) and hardware (``fp16_hwcvt_vw``) conversions.
CUDA_QUANT_PATHS = ["dequant", "fold", "fp16_vw", "fp16_hwcvt_vw"]


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("path", CUDA_QUANT_PATHS)
@pytest.mark.parametrize("name", ["int8", "fp8", "k_int8_v_fp8", "k_int8_g16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("specs", [[(1, 3000), (1, 70), (1, 1), (1, 4097)], [(200, 700), (1, 40), (64, 64), (0, 9)]])
def test_cuda_quantized_paths(specs, block_size, name, path):
    layout = QUANT_LAYOUTS[name]
    q, cache, meta = make_case(specs, 16, 8, 128, block_size, torch.bfloat16, layout=layout, pad_tokens=2)
    check(q, cache, meta, layout=layout, config=AttentionConfig(16, 64, 4, 2, quant_path=path)
          if specs[0][0] == 1 else AttentionConfig(64, 32, 4, 3, quant_path=path))
    check(q, cache, meta, layout=layout)  # default config and path


FOLD_TILES = [(32, 4, 2, 0), (64, 4, 3, 0), (128, 4, 2, 0), (128, 8, 2, 0), (128, 4, 3, 0), (64, 8, 2, 0),
              (64, 4, 2, 7), (128, 4, 2, 16)]
FP16_TILES = [(128, 4, 2, 0), (64, 2, 2, 0), (64, 4, 2, 7), (32, 4, 2, 16)]  # attention_quant_tune checks the rest


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("path,tile", [("fold", t) for t in FOLD_TILES] + [("fp16_hwcvt_vw", t) for t in FP16_TILES])
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
    for path in ("fold", "fp16_hwcvt_vw", "fp16_vw"):
        out = paged_attention(q, q, q, cache, meta, 0.088, layout=layout,
                              config=AttentionConfig(16, 128, 4, 2, quant_path=path)).float()
        errs[path] = ((out - ref).norm() / ref.norm()).item()
    assert errs["fp16_hwcvt_vw"] <= errs["fold"] * 1.1 and errs["fp16_vw"] <= errs["fold"] * 1.1, errs


def test_one_byte_decode_tile_and_its_split_rule():
    """Pure decode steps on a one-byte cache get the 1-warp fp16_hwcvt tile (H200 sweep, session 7); a step with
    a chunk of 2+ tokens keeps the 4-warp tiles; 1-warp grids split from under 6 programs per SM."""
    from nanocore.kernels import attention_config as ac
    decode = ac.default_config(1, 4, 128, kv_itemsize=1)
    assert (decode.block_m, decode.block_n, decode.num_warps, decode.quant_path) == (16, 32, 1, "fp16_hwcvt")
    chunk = ac.default_config(3, 4, 128, kv_itemsize=1)
    assert (chunk.num_warps, chunk.quant_path) == (4, "fold")
    assert ac.default_config(1, 32, 128, kv_itemsize=1).num_warps == 4  # 32 GQA rows: too many for one warp
    assert ac.default_config(1, 4, 128).num_warps == 4  # a bf16 cache keeps its tile
    sms = 132
    assert ac.choose_num_splits(512, 4096, 32, sms, num_warps=1) == 4  # the sweep's best at 64 seqs x 8 heads
    assert ac.choose_num_splits(1024, 512, 32, sms, num_warps=1) == 1  # GQA 7 at 256 x 512: unsplit was fastest
    assert ac.choose_num_splits(8, 16384, 32, sms, num_warps=1) == 64  # batch 1 at 16K: fill the GPU
    assert ac.choose_num_splits(8, 700, 32, sms, num_warps=1) == 2  # every split 256+ keys
    assert ac.choose_num_splits(8, 200, 32, sms, num_warps=1) == 1
    assert ac.choose_num_splits(512, 4096, 64, sms) == 1  # 4-warp rule unchanged
    assert ac.choose_num_splits(256, 4096, 64, sms) == 4
