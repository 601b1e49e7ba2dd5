"""KVCodecConformance: allocation size, store/gather, slot -1, and paged attention against ``unquantized``."""
from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec
from nanocore.interfaces import KVCache
from nanocore.layers.attention import AttentionMetadata, paged_attention_reference
from nanocore_conformance.base import assert_close, check_tolerance_declaration, generator, randn, suite_settings
from nanocore_conformance.contract import BackendContractConformance


def per_slot(cache: KVCache) -> list[torch.Tensor]:
    """Every cache tensor viewed as ``[num_slots, ...]`` (clones, for before/after comparisons)."""
    return [t.reshape(t.shape[0] * t.shape[1], -1).clone() for t in cache.tensors()]


def fill_cache(codec, cache: KVCache, heads: int, head_dim: int, dtype, device, seed: int):
    """Store random K/V into every slot; return them as ``[num_slots, heads, head_dim]``."""
    num_slots = cache.num_blocks * cache.block_size
    g = generator(seed)
    k = randn(num_slots, heads, head_dim, seed_gen=g, dtype=dtype, device=device)
    v = randn(num_slots, heads, head_dim, seed_gen=g, dtype=dtype, device=device)
    codec.store(cache, k, v, torch.arange(num_slots, device=device))
    return k, v


def attention_case(seq_specs, heads, group, head_dim, block_size, dtype, device, seed):
    """Random q and metadata for sequences ``(seq_len, query_len)`` over a shuffled block table."""
    blocks_per_seq = [-(-seq_len // block_size) for seq_len, _ in seq_specs]
    g = generator(seed)
    order = torch.randperm(sum(blocks_per_seq), generator=g).to(torch.int32)
    table = torch.zeros(len(seq_specs), max(blocks_per_seq), dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks_per_seq):
        table[b, :n] = order[start:start + n]
        start += n
    query_lens = [q for _, q in seq_specs]
    seq_lens = [s for s, _ in seq_specs]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.full((starts[-1],), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device), max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens, seq_lens_cpu=seq_lens, impl="torch",
    )
    q = randn(starts[-1], heads * group, head_dim, seed_gen=g, dtype=dtype, device=device)
    return q, meta, sum(blocks_per_seq)


class KVCodecConformance(BackendContractConformance):
    kind = "kv_codec"
    #: Requirements: head dims to try (a group-scaled codec needs multiples of its group size).
    head_dims: ClassVar[tuple[int, ...]] = (32, 64, 128)
    block_sizes: ClassVar[tuple[int, ...]] = (4, 16)

    def codec(self, backend_cls, options):
        return backend_cls(options)

    def test_tolerance_declared(self, backend_cls):
        check_tolerance_declaration(backend_cls)

    @suite_settings
    @given(heads=st.integers(1, 4), data=st.data(), num_blocks=st.integers(1, 5))
    def test_bytes_per_token_is_what_allocate_allocates(self, backend_cls, backend_options, dtype, device,
                                                         heads, data, num_blocks):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        codec = self.codec(backend_cls, backend_options)
        cache = codec.allocate(num_blocks, block_size, heads, head_dim, dtype, device)
        allocated = sum(t.numel() * t.element_size() for t in cache.tensors())
        declared = codec.bytes_per_token(heads, head_dim, dtype)
        assert allocated == declared * num_blocks * block_size, (
            f"bytes_per_token says {declared} B/token but allocate() allocated {allocated} B for "
            f"{num_blocks * block_size} tokens ({allocated / (num_blocks * block_size):g} B/token)")
        for t in cache.tensors():
            assert t.shape[:2] == (num_blocks, block_size), f"cache tensor {tuple(t.shape)} is not [num_blocks, block_size, ...]"

    @suite_settings
    @given(heads=st.integers(1, 4), data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_store_gather_round_trip(self, backend_cls, backend_options, dtype, device, heads, data, seed):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        num_blocks = data.draw(st.integers(1, 4))
        codec = self.codec(backend_cls, backend_options)
        cache = codec.allocate(num_blocks, block_size, heads, head_dim, dtype, device)
        k, v = fill_cache(codec, cache, heads, head_dim, dtype, device, seed)
        slots = torch.randperm(k.shape[0], generator=generator(seed)).to(device)
        got_k, got_v = codec.gather(cache, slots, dtype)
        assert got_k.dtype == dtype and got_v.dtype == dtype, f"gather must return {dtype}, got {got_k.dtype}/{got_v.dtype}"
        assert_close(got_k, k[slots], backend_cls.tolerance, f"{self.backend} gathered K vs stored K")
        assert_close(got_v, v[slots], backend_cls.tolerance, f"{self.backend} gathered V vs stored V")

    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_slot_minus_one_leaves_cache_untouched(self, backend_cls, backend_options, dtype, device, data, seed):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        codec = self.codec(backend_cls, backend_options)
        cache = codec.allocate(3, block_size, 2, head_dim, dtype, device)
        fill_cache(codec, cache, 2, head_dim, dtype, device, seed)
        num_slots = 3 * block_size
        before = per_slot(cache)
        # the last slot is never written: a codec indexing with -1 would overwrite it
        written = data.draw(st.lists(st.integers(0, num_slots - 2), unique=True, max_size=num_slots - 1))
        mapping = data.draw(st.permutations(written + [-1] * data.draw(st.integers(1, 4))))
        g = generator(seed + 1)
        k = randn(len(mapping), 2, head_dim, seed_gen=g, dtype=dtype, device=device)
        v = randn(len(mapping), 2, head_dim, seed_gen=g, dtype=dtype, device=device)
        codec.store(cache, k, v, torch.tensor(mapping, dtype=torch.int64, device=device))
        untouched = torch.tensor([s for s in range(num_slots) if s not in written], dtype=torch.long)
        for old, new in zip(before, per_slot(cache)):
            assert torch.equal(old[untouched.to(old.device)], new[untouched.to(new.device)]), (
                "store() changed slots that were not in slot_mapping (slot -1 must be skipped)")

    def _attention_check(self, backend_cls, options, dtype, device, data, seed):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        heads, group = data.draw(st.integers(1, 3)), data.draw(st.sampled_from([1, 2]))
        seq_specs = []
        for _ in range(data.draw(st.integers(1, 3))):
            seq_len = data.draw(st.integers(1, 3 * block_size))
            seq_specs.append((seq_len, data.draw(st.integers(1, seq_len))))
        q, meta, num_blocks = attention_case(seq_specs, heads, group, head_dim, block_size, dtype, device, seed)
        outs = []
        for codec in (self.codec(backend_cls, options), UnquantizedKVCodec()):
            cache = codec.allocate(num_blocks, block_size, heads, head_dim, dtype, device)
            fill_cache(codec, cache, heads, head_dim, dtype, device, seed)
            meta.codec = codec
            outs.append(paged_attention_reference(q, None, None, cache, meta, head_dim ** -0.5))
        assert_close(outs[0], outs[1], backend_cls.tolerance, f"{self.backend} paged attention vs unquantized")

    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_attention_matches_unquantized(self, backend_cls, backend_options, dtype, device, data, seed):
        self._attention_check(backend_cls, backend_options, dtype, device, data, seed)

    @pytest.mark.cuda
    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_attention_matches_unquantized_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device,
                                                   data, seed):
        self._attention_check(backend_cls, backend_options, cuda_dtype, cuda_device, data, seed)
