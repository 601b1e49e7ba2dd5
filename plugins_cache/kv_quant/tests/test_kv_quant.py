"""Tests of the quantized KV codecs: layout and bytes, round trip, slot -1, attention vs the oracle."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocore.layers.attention import AttentionMetadata, paged_attention_reference
from nanocore.plugins import get_registry
from nanocore.toolkit.reference import UnquantizedKVCodec
from nanocore_kv_quant import Fp8E4M3KVCodec, Int8KVCodec, KInt8VFp8KVCodec

CODECS = ["int8", "fp8_e4m3", "k_int8_v_fp8"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
examples = settings(max_examples=30, deadline=None)


def make(name):
    return get_registry().get("kv_codec", name).cls()


def allocated_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for t in cache.tensors())


def test_registered_by_name_and_never_auto():
    registry = get_registry()
    assert {Int8KVCodec, Fp8E4M3KVCodec, KInt8VFp8KVCodec} == {registry.get("kv_codec", n).cls for n in CODECS}
    assert registry.resolve("kv_codec", "auto", "cpu").name == "unquantized"


def test_layouts():
    assert make("int8").layout(torch.bfloat16) == Int8KVCodec().layout(torch.float16)
    mixed = make("k_int8_v_fp8").layout(torch.bfloat16)
    assert (mixed.k_dtype, mixed.v_dtype) == (torch.int8, torch.float8_e4m3fn)
    assert (mixed.k_scale, mixed.v_scale, mixed.group_size, mixed.scale_dtype) == ("group", "token_head", 32, torch.float16)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 32), (2, 64), (8, 128), (3, 96)])
def test_bytes_per_token_equals_allocated(name, num_kv_heads, head_dim):
    codec = make(name)
    for dtype in DTYPES:
        cache = codec.allocate(3, 16, num_kv_heads, head_dim, dtype, torch.device("cpu"))
        assert allocated_bytes(cache) == 3 * 16 * codec.bytes_per_token(num_kv_heads, head_dim, dtype)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_k_int8_v_fp8_is_under_053x_of_bf16(head_dim):
    ratio = make("k_int8_v_fp8").bytes_per_token(8, head_dim, torch.bfloat16) / \
        UnquantizedKVCodec().bytes_per_token(8, head_dim, torch.bfloat16)
    assert ratio <= 0.53 and 1 / ratio >= 1.85


def test_group_size_must_divide_head_dim():
    with pytest.raises(ValueError, match="head_dim is 48"):
        make("k_int8_v_fp8").allocate(2, 16, 2, 48, torch.bfloat16, torch.device("cpu"))


@pytest.mark.parametrize("name", CODECS)
def test_unknown_option_is_an_error(name):
    with pytest.raises(ValueError, match="unknown option"):
        get_registry().get("kv_codec", name).cls({"bogus": 1})


def store_all(codec, x, dtype, block_size=16):
    n, h, d = x.shape
    cache = codec.allocate(-(-n // block_size), block_size, h, d, dtype, torch.device("cpu"))
    codec.store(cache, x, -x, torch.arange(n))
    return cache, codec.gather(cache, torch.arange(n), dtype)


@pytest.mark.parametrize("name", CODECS)
@examples
@given(num_tokens=st.integers(1, 40), num_kv_heads=st.integers(1, 4), head_dim=st.sampled_from([32, 64, 96, 128]),
       dtype=st.sampled_from(DTYPES), magnitude=st.sampled_from([0.05, 1.0, 30.0, 1000.0]), seed=st.integers(0, 999))
def test_roundtrip_within_declared_bound(name, num_tokens, num_kv_heads, head_dim, dtype, magnitude, seed):
    codec = make(name)
    g = torch.Generator().manual_seed(seed)
    # rows of different magnitudes, so a scale shared too widely would show
    rows = magnitude * (0.01 + torch.rand(num_tokens, num_kv_heads, 1, generator=g))
    x = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=g) * rows).to(dtype)
    _, (k, v) = store_all(codec, x, dtype)
    amax = x.float().abs().amax(-1, keepdim=True)
    for got, want in ((k, x), (v, -x)):
        assert got.dtype == dtype and got.shape == x.shape
        err = (got.float() - want.float()).abs()
        assert (err <= codec.roundtrip_error * amax).all(), (err / amax).max().item()


@pytest.mark.parametrize("name", CODECS)
def test_zero_and_tiny_vectors_give_no_nan(name):
    x = torch.zeros(4, 2, 64)
    x[1] = 1e-6 * torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    _, (k, v) = store_all(make(name), x, torch.float32)
    assert torch.isfinite(k).all() and torch.isfinite(v).all()
    assert (k[0] == 0).all() and (v[0] == 0).all()
    assert (k - x).abs().max() < 1e-5


@pytest.mark.parametrize("name", CODECS)
def test_scales_come_from_the_data(name):
    codec = make(name)
    x = torch.randn(5, 2, 64, generator=torch.Generator().manual_seed(1)) * 7
    cache, _ = store_all(codec, x, torch.float32)
    layout = codec.layout(torch.float32)
    for side, scale, values in (("k", cache.k_scale, cache.k), ("v", cache.v_scale, cache.v)):
        groups = scale.shape[-1]
        amax = x.abs().view(5, 2, groups, 64 // groups).amax(-1)
        qmax = 127.0 if values.dtype == torch.int8 else 448.0
        expected = (amax / qmax).to(layout.scale_dtype).float()
        torch.testing.assert_close(scale.view(-1, 2, groups)[:5].float(), expected, msg=f"{name} {side} scales")


@pytest.mark.parametrize("name", CODECS)
def test_slot_minus_one_is_untouched(name):
    codec = make(name)
    g = torch.Generator().manual_seed(2)
    cache = codec.allocate(2, 4, 2, 64, torch.bfloat16, torch.device("cpu"))
    for t in cache.tensors():  # random bytes everywhere, so any stray write shows
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=g, dtype=torch.uint8))
    before = [t.clone() for t in cache.tensors()]
    k = torch.randn(4, 2, 64, generator=g).to(torch.bfloat16)
    slots = torch.tensor([5, -1, 2, -1])
    codec.store(cache, k, k, slots)
    for old, new in zip(before, cache.tensors()):
        changed = (old.view(8, -1).view(torch.uint8) != new.view(8, -1).view(torch.uint8)).any(-1)
        assert set(changed.nonzero().flatten().tolist()) <= {5, 2}
    got_k, _ = codec.gather(cache, torch.tensor([5, 2]), torch.bfloat16)
    assert (got_k.float() - k[[0, 2]].float()).abs().max() < 0.2


def paged_attention_both(name, seq_lens, query_lens, num_kv_heads, group, head_dim, dtype, seed, block_size=16):
    """Attention over a paged cache written by ``name`` and by the unquantized oracle, same data."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = [-(-n // block_size) for n in seq_lens]
    perm = torch.randperm(sum(num_blocks), generator=g).to(torch.int32)  # scattered, not contiguous blocks
    tables = torch.zeros(len(seq_lens), max(num_blocks), dtype=torch.int32)
    slots, start = [], 0
    for b, (n, nb) in enumerate(zip(seq_lens, num_blocks)):
        tables[b, :nb] = perm[start:start + nb]
        start += nb
        slots.append((tables[b, :nb].long()[:, None] * block_size + torch.arange(block_size)).flatten()[:n])
    slot_mapping = torch.cat(slots)
    k = torch.randn(len(slot_mapping), num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(len(slot_mapping), num_kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, generator=g).to(dtype)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    outs = []
    for codec in (UnquantizedKVCodec(), make(name)):
        cache = codec.allocate(sum(num_blocks), block_size, num_kv_heads, head_dim, dtype, torch.device("cpu"))
        codec.store(cache, k, v, slot_mapping)
        meta = AttentionMetadata(
            slot_mapping=torch.full((sum(query_lens),), -1), query_start_loc=starts,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=tables,
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), kv_caches=[cache], codec=codec,
            query_lens_cpu=list(query_lens), seq_lens_cpu=list(seq_lens))
        outs.append(paged_attention_reference(q, None, None, cache, meta, head_dim ** -0.5))  # all from the cache
    return outs


@pytest.mark.parametrize("name", CODECS)
@examples
@given(data=st.data(), num_kv_heads=st.integers(1, 2), group=st.sampled_from([1, 3]),
       head_dim=st.sampled_from([32, 64]), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 999))
def test_attention_matches_unquantized_oracle(name, data, num_kv_heads, group, head_dim, dtype, seed):
    seq_lens = data.draw(st.lists(st.integers(1, 200), min_size=1, max_size=3))
    query_lens = [data.draw(st.integers(1, n)) for n in seq_lens]  # prefill chunks and decodes
    expected, got = paged_attention_both(name, seq_lens, query_lens, num_kv_heads, group, head_dim, dtype, seed)
    atol, rtol = make(name).tolerance
    err = (got.float() - expected.float()).abs()
    assert torch.isfinite(got).all()
    assert (err <= atol + rtol * expected.float().abs()).all(), err.max().item()
