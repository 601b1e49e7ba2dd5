"""Chunks attend to their own K/V in the model dtype and to cached tokens through the codec: kernel vs reference.

The cache is written by the real codecs (int8, fp8_e4m3, k_int8_v_fp8) the way the layer does it: every token of
the step stored first, then attention. Without CUDA the kernel runs in Triton's interpreter (fp16 / fp32 only).
"""
import pytest
import torch

pytest.importorskip("triton")

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec  # noqa: E402
from nanocore.kernels.paged_attention import AttentionConfig, paged_attention  # noqa: E402
from nanocore.layers.attention import (AttentionMetadata, block_slots, causal_attention_reference,  # noqa: E402
                                       paged_attention_reference)
from nanocore.plugins import get_registry  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CODECS = ["int8", "fp8_e4m3", "k_int8_v_fp8"]
#: (query_len, seq_len): a chunk after an unaligned cached prefix, a decode, a first chunk, a short chunk.
SPECS = [(24, 70), (1, 40), (17, 17), (5, 37)]
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 64, 16


def make_codec(name):
    try:
        return get_registry().get("kv_codec", name).cls()
    except (KeyError, ValueError):
        pytest.skip(f"kv codec {name!r} is not installed")


def stored_case(codec, specs, dtype, seed=0, heads=(HEADS, KV_HEADS, HEAD_DIM)):
    """q, the step's k_new / v_new, a cache holding every position of each sequence (stored by ``codec``), meta."""
    num_heads, num_kv_heads, head_dim = heads
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-lk // BLOCK_SIZE) for _, lk in specs]
    cache = codec.allocate(sum(blocks) + 2, BLOCK_SIZE, num_kv_heads, head_dim, dtype, torch.device(DEVICE))
    perm = torch.randperm(sum(blocks) + 2, generator=g)[:sum(blocks)].int()
    tables = torch.zeros(len(specs), max(blocks), dtype=torch.int32)
    k_new, v_new, used = [], [], 0
    for b, ((lq, lk), n) in enumerate(zip(specs, blocks)):
        tables[b, :n] = perm[used:used + n]
        used += n
        k, v = (torch.randn(lk, num_kv_heads, head_dim, generator=g).to(dtype).to(DEVICE) for _ in range(2))
        codec.store(cache, k, v, block_slots(tables[b], lk, BLOCK_SIZE).to(DEVICE))
        k_new.append(k[lk - lq:])
        v_new.append(v[lk - lq:])
    query_lens, seq_lens = [lq for lq, _ in specs], [lk for _, lk in specs]
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.full((sum(query_lens),), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=starts.to(DEVICE), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE), max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        kv_caches=[cache], codec=codec, query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    return q, torch.cat(k_new), torch.cat(v_new), cache, meta


def by_hand(q, k_new, v_new, cache, meta, scale):
    """Prefix dequantized by the codec's gather, the chunk's own K/V as given (decodes: all from the cache)."""
    out, start = torch.empty_like(q), 0
    for b, (lq, lk) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
        own = lq if lq > 1 else 0
        k, v = meta.codec.gather(cache, block_slots(meta.block_tables[b], lk - own, BLOCK_SIZE), q.dtype)
        k = torch.cat([k, k_new[start:start + own]])
        v = torch.cat([v, v_new[start:start + own]])
        out[start:start + lq] = causal_attention_reference(q[start:start + lq], k, v, scale)
        start += lq
    return out.float()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def rows(meta, b):
    lo, hi = meta.query_start_loc[b].item(), meta.query_start_loc[b + 1].item()
    return slice(lo, hi)


@pytest.mark.parametrize("config", [None, AttentionConfig(16, 16, 4, 1), AttentionConfig(64, 16, 4, 1, num_splits=3),
                                    AttentionConfig(16, 16, 4, 1, num_splits=3),
                                    AttentionConfig(32, 32, 4, 1, quant_path="fp16_hwcvt")],
                         ids=["default", "tiles_16", "split_3", "q_tiles_split_3", "fp16_path"])
@pytest.mark.parametrize("name", CODECS)
def test_chunk_reads_its_own_kv_unquantized(name, config):
    codec = make_codec(name)
    q, k_new, v_new, cache, meta = stored_case(codec, SPECS, torch.float16)
    scale, layout = HEAD_DIM ** -0.5, codec.layout(torch.float16)
    out = paged_attention(q, k_new, v_new, cache, meta, scale, layout=layout, config=config)
    ref = paged_attention_reference(q, k_new, v_new, cache, meta, scale)
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 1e-2 and rel(ref, by_hand(q, k_new, v_new, cache, meta, scale)) < 1e-3
    meta.kv_from_cache = True  # today's path: the chunk reads itself back through the codec
    through = paged_attention(q, k_new, v_new, cache, meta, scale, layout=layout, config=config)
    through_ref = paged_attention_reference(q, k_new, v_new, cache, meta, scale)
    assert rel(through, through_ref) < 1e-2
    for b in (0, 2, 3):  # chunks: nearer the fresh reference than the quantized one (fp32: see below)
        r = rows(meta, b)
        assert 2 * rel(out[r], ref[r]) < rel(out[r], through_ref[r])
        assert 2 * rel(through[r], through_ref[r]) < rel(through[r], ref[r])
    assert rel(out[rows(meta, 1)], through[rows(meta, 1)]) < 1e-3  # the decode row reads the cache either way


@pytest.mark.parametrize("name", ["int8", "k_int8_v_fp8"])
def test_fp32_fresh_path_is_tight(name):
    codec = make_codec(name)
    q, k_new, v_new, cache, meta = stored_case(codec, SPECS, torch.float32, seed=1)
    scale = HEAD_DIM ** -0.5
    out = paged_attention(q, k_new, v_new, cache, meta, scale, layout=codec.layout(torch.float32),
                          config=AttentionConfig(32, 16, 4, 1))
    fresh = by_hand(q, k_new, v_new, cache, meta, scale)
    assert rel(out, fresh) < 1e-5
    meta.kv_from_cache = True  # the chunks' own K/V through int8: an error 100x the kernel's
    assert rel(paged_attention_reference(q, k_new, v_new, cache, meta, scale), fresh) > 1e-3


def test_unquantized_cache_gives_the_same_result_either_way():
    codec = UnquantizedKVCodec()
    q, k_new, v_new, cache, meta = stored_case(codec, SPECS, torch.float32, seed=2)
    out = paged_attention(q, k_new, v_new, cache, meta, 0.125, config=AttentionConfig(16, 16, 4, 1))
    ref = paged_attention_reference(q, k_new, v_new, cache, meta, 0.125)
    meta.kv_from_cache = True
    through = paged_attention(q, k_new, v_new, cache, meta, 0.125, config=AttentionConfig(16, 16, 4, 1))
    assert rel(out, ref) < 1e-5 and rel(through, ref) < 1e-5
    assert torch.equal(paged_attention_reference(q, k_new, v_new, cache, meta, 0.125), ref)


@pytest.mark.parametrize("path", [None, "fp16_hwcvt"])
@pytest.mark.parametrize("name", CODECS)
def test_first_chunks_only_never_read_the_cache(name, path):
    """A batch of fresh prompts runs the bf16 cache's kernel whatever the codec: the same output, bit for bit."""
    specs, config = [(24, 24), (17, 17), (5, 5)], AttentionConfig(32, 16, 4, 1, quant_path=path)
    q, k_new, v_new, cache, meta = stored_case(make_codec(name), specs, torch.float16, seed=5)
    out = paged_attention(q, k_new, v_new, cache, meta, 0.125, layout=meta.codec.layout(torch.float16), config=config)
    assert rel(out, paged_attention_reference(q, k_new, v_new, cache, meta, 0.125)) < 1e-2
    q, k_new, v_new, cache, meta = stored_case(UnquantizedKVCodec(), specs, torch.float16, seed=5)
    assert torch.equal(out, paged_attention(q, k_new, v_new, cache, meta, 0.125, config=config))
    meta.kv_from_cache = True  # the same batch through the cache takes the cache walk, and matches too
    assert rel(paged_attention(q, k_new, v_new, cache, meta, 0.125, config=config), out) < 1e-3


def test_only_a_batch_of_first_chunks_skips_the_cache_walk():
    from nanocore.kernels.attention_config import reads_cache

    def _reads_cache(fresh, meta):
        return reads_cache(fresh, meta.query_lens_cpu, meta.seq_lens_cpu)

    def meta(query_lens, seq_lens):  # only the host lists matter
        return AttentionMetadata(None, None, None, None, max(query_lens), max(seq_lens),
                                 query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)
    assert not _reads_cache(True, meta([24, 17], [24, 17]))
    assert _reads_cache(True, meta([24, 17], [24, 40]))  # a cached prefix
    assert _reads_cache(True, meta([24, 1], [24, 1]))  # a one-token prompt reads itself from the cache
    assert _reads_cache(True, meta([24, 0], [24, 9]))  # a row with no query still has cached tokens
    assert _reads_cache(False, meta([24, 17], [24, 17]))  # not fresh: everything comes from the cache
    no_host_lists = meta([24], [24])
    no_host_lists.query_lens_cpu = None
    assert _reads_cache(True, no_host_lists)


def test_k_new_in_another_float_dtype_or_strided_is_read_as_is():
    codec = make_codec("int8")
    q, k_new, v_new, cache, meta = stored_case(codec, SPECS, torch.float16, seed=4)
    layout = codec.layout(torch.float16)
    out = paged_attention(q, k_new, v_new, cache, meta, 0.125, layout=layout)
    wide = torch.stack([k_new.float(), k_new.float()], dim=-1)[..., 0]  # fp32, head_dim stride 2
    assert rel(paged_attention(q, wide, v_new.float(), cache, meta, 0.125, layout=layout), out) < 1e-2
    assert rel(paged_attention(q, k_new, v_new, cache, meta, 0.125, layout=layout), out) == 0


def test_bad_k_new_is_a_clear_error():
    codec = make_codec("int8")
    q, k_new, v_new, cache, meta = stored_case(codec, SPECS, torch.float16)
    layout = codec.layout(torch.float16)
    with pytest.raises(ValueError, match="k_new must be"):
        paged_attention(q, q, q, cache, meta, 0.125, layout=layout)  # query heads, not KV heads
    with pytest.raises(ValueError, match="float dtype"):
        paged_attention(q, k_new.to(torch.int8), v_new, cache, meta, 0.125, layout=layout)
    with pytest.raises(ValueError, match="without v_new"):
        paged_attention(q, k_new, None, cache, meta, 0.125, layout=layout)
    with pytest.raises(ValueError, match="without a cache"):
        paged_attention(q, None, None, None, AttentionMetadata.for_prefill([q.shape[0]], DEVICE), 0.125)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("path", [None, "fp16_hwcvt"])
@pytest.mark.parametrize("name", CODECS)
def test_cuda_bf16_chunks_after_long_prefixes(name, path):
    """Engine-like shapes: chunks of 512 / 300 after 3,000+ cached tokens, a first chunk, decodes; bf16."""
    codec = make_codec(name)
    specs = [(512, 3583), (1, 2048), (300, 300), (1, 1), (77, 4173)]
    q, k_new, v_new, cache, meta = stored_case(codec, specs, torch.bfloat16, heads=(32, 8, 128))
    layout = codec.layout(torch.bfloat16)
    config = AttentionConfig(64, 32, 4, 3, quant_path=path) if path else None
    out = paged_attention(q, k_new, v_new, cache, meta, 128 ** -0.5, layout=layout, config=config)
    ref = paged_attention_reference(q, k_new, v_new, cache, meta, 128 ** -0.5)
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-2
