"""KVCodecConformance: allocation per the declared layout, stored values after engine-shaped and scattered writes,
``gather`` against the raw layout, and attention (through ``gather`` and through the core's Triton kernel reading
the layout) against the unquantized oracle."""
from __future__ import annotations

import os
from typing import ClassVar

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from nanocore.layers.attention import paged_attention_reference
from nanocore_conformance.base import (MAX_EXAMPLES, assert_close, check_tolerance_declaration, generator,
                                       suite_settings)
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.kv_codec_boundaries import KVCodecBoundaryConformance
from nanocore_conformance.kv_codec_cases import (ShadowCache, attention_inputs, engine_sequences, oracle_attention,
                                                 prefill_then_decode, scattered_writes)
from nanocore_conformance.kv_codec_layout import check_allocation, layout_bytes_per_token, read_like_core

# Triton's interpreter takes about half a second per example: fewer of them (the layouts are few), and no
# shrinking (minutes of interpreted runs; the failure message already names the broken rule)
kernel_settings = settings(suite_settings, max_examples=max(1, MAX_EXAMPLES // 5),
                           phases=(Phase.explicit, Phase.reuse, Phase.generate), report_multiple_bugs=False)


def compute_slack(dtype: torch.dtype) -> float:
    """Extra (atol, rtol) for attention computed in a 16-bit dtype (the oracle is float32)."""
    return 0.0 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps


def core_kernel_unavailable(device: torch.device) -> str | None:
    """Why the core's Triton attention cannot run here, or None."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return ("the core Triton attention runs on CPU only in Triton's interpreter: set TRITON_INTERPRET=1 before "
                "Triton is imported (e.g. at the top of your conftest.py)")
    return None


class KVCodecConformance(KVCodecBoundaryConformance, BackendContractConformance):
    kind = "kv_codec"
    #: Requirements: head dims to try (a group-scaled codec needs multiples of its group size).
    head_dims: ClassVar[tuple[int, ...]] = (32, 64, 128)
    block_sizes: ClassVar[tuple[int, ...]] = (4, 16)
    #: How scales are chosen: "amax" = amax / qmax exactly as the toolkit's quantizer; None = within the contract's
    #: bound (at most twice amax / qmax).
    scale_rule: ClassVar[str | None] = None
    requirement_names = ("head_dims", "block_sizes", "scale_rule")

    def codec(self, backend_cls, options):
        return backend_cls(options)

    def test_tolerance_declared(self, backend_cls):
        check_tolerance_declaration(backend_cls)

    @suite_settings
    @given(heads=st.integers(1, 4), data=st.data(), num_blocks=st.integers(1, 5))
    def test_allocation_follows_layout(self, backend_cls, backend_options, dtype, device, heads, data, num_blocks):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        codec = self.codec(backend_cls, backend_options)
        layout = codec.layout(dtype)
        cache = codec.allocate(num_blocks, block_size, heads, head_dim, dtype, device)
        check_allocation(cache, layout, num_blocks, block_size, heads, head_dim)
        allocated = sum(t.numel() * t.element_size() for t in cache.tensors())
        declared = codec.bytes_per_token(heads, head_dim, dtype)
        implied = layout_bytes_per_token(layout, heads, head_dim)
        assert declared == implied, (
            f"bytes_per_token says {declared} B/token but the declared layout takes {implied} B/token (K and V "
            f"values plus their scales); the engine sizes the KV cache from bytes_per_token, so it must be exact")
        assert allocated == declared * num_blocks * block_size, (
            f"bytes_per_token says {declared} B/token but allocate() allocated {allocated} B for "
            f"{num_blocks * block_size} tokens ({allocated / (num_blocks * block_size):g} B/token)")

    def _shadow(self, backend_cls, options, dtype, device, heads, head_dim, block_size, num_blocks, seed,
                verify=True):
        codec = self.codec(backend_cls, options)
        layout = codec.layout(dtype)
        cache = codec.allocate(num_blocks, block_size, heads, head_dim, dtype, device)
        check_allocation(cache, layout, num_blocks, block_size, heads, head_dim)
        return ShadowCache(codec, cache, layout, seed, verify, self.scale_rule)

    def _engine_writes(self, backend_cls, options, dtype, device, data, seed):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        heads = data.draw(st.integers(1, 3))
        seqs, num_blocks = engine_sequences(data, block_size)
        shadow = self._shadow(backend_cls, options, dtype, device, heads, head_dim, block_size, num_blocks, seed)
        for name, mapping in prefill_then_decode(data, seqs, block_size):
            shadow.store(name, mapping, dtype)

    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_prefill_then_decode_writes(self, backend_cls, backend_options, dtype, device, data, seed):
        """Engine-shaped stores (sequences on shuffled blocks, prefill chunks, then one token per sequence in
        shuffled order with -1 padding): after each, the written slots hold their values, the rest is unchanged."""
        self._engine_writes(backend_cls, backend_options, dtype, device, data, seed)

    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_scattered_writes_and_rewrites(self, backend_cls, backend_options, dtype, device, data, seed):
        """Every slot out of order, then rewrites of random slots with gaps and -1 entries."""
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        num_blocks, heads = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
        shadow = self._shadow(backend_cls, backend_options, dtype, device, heads, head_dim, block_size, num_blocks,
                              seed)
        for name, mapping in scattered_writes(data, num_blocks * block_size):
            shadow.store(name, mapping, dtype)

    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_gather_dequantizes_the_layout(self, backend_cls, backend_options, dtype, device, data, seed):
        """``gather`` returns what the core attention reads from the raw tensors (values times their scales)."""
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        num_blocks, heads = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
        shadow = self._shadow(backend_cls, backend_options, dtype, device, heads, head_dim, block_size, num_blocks,
                              seed, verify=False)
        num_slots = num_blocks * block_size
        shadow.store("every slot, out of order", data.draw(st.permutations(range(num_slots))), dtype)
        slots = torch.randint(0, num_slots, (data.draw(st.integers(1, 2 * num_slots)),), generator=generator(seed))
        got = shadow.codec.gather(shadow.cache, slots.to(device), dtype)
        expected = read_like_core(shadow.cache, slots.to(device))
        for side, g, e in zip("KV", got, expected):
            assert g.dtype == dtype, f"gather must return {dtype}, got {side} in {g.dtype}"
            assert_close(g, e.to(dtype), (1e-30, 2 * torch.finfo(dtype).eps),
                         f"gather: {side} differs from the raw cache dequantized per the declared layout "
                         f"(stored value x its scale, as the core attention reads it); gather must be that reference")

    def _attention_check(self, backend_cls, options, dtype, device, data, seed, core_kernel: bool):
        head_dim = data.draw(st.sampled_from(self.head_dims))
        block_size = data.draw(st.sampled_from(self.block_sizes))
        heads, group = data.draw(st.integers(1, 3)), data.draw(st.sampled_from([1, 2]))
        seqs, num_blocks = engine_sequences(data, block_size, max_seqs=3)
        shadow = self._shadow(backend_cls, options, dtype, device, heads, head_dim, block_size, num_blocks, seed,
                              verify=False)
        for name, mapping in prefill_then_decode(data, seqs, block_size):
            shadow.store(name, mapping, dtype)
        q, meta = attention_inputs(data, seqs, block_size, heads * group, head_dim, dtype, device, generator(seed))
        meta.codec = shadow.codec
        scale = head_dim ** -0.5
        if core_kernel:
            from nanocore.kernels.paged_attention import paged_attention  # imports Triton: only where it runs
            out = paged_attention(q, None, None, shadow.cache, meta, scale, layout=shadow.layout)
            what = (f"{self.backend}: the core Triton attention reading the declared layout {shadow.layout} vs the "
                    f"unquantized oracle (store must write what layout() declares; gather cannot hide a difference)")
        else:
            out = paged_attention_reference(q, None, None, shadow.cache, meta, scale)
            what = f"{self.backend}: attention through gather vs the unquantized oracle"
        expected = oracle_attention(q, meta, seqs, shadow, block_size, scale)
        slack = compute_slack(dtype)
        atol, rtol = backend_cls.tolerance
        assert_close(out, expected, (atol + slack, rtol + slack), what)

    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_attention_matches_unquantized(self, backend_cls, backend_options, dtype, device, data, seed):
        self._attention_check(backend_cls, backend_options, dtype, device, data, seed, core_kernel=False)

    @kernel_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_core_kernel_attention_matches_unquantized(self, backend_cls, backend_options, device, data, seed):
        """The attention the GPU runs: the core kernel reads the raw cache per ``layout()`` (here in Triton's
        interpreter on CPU, float32 or float16 compute)."""
        reason = core_kernel_unavailable(device)
        if reason:
            pytest.skip(reason)
        dtype = data.draw(st.sampled_from([torch.float32, torch.float16]))
        self._attention_check(backend_cls, backend_options, dtype, device, data, seed, core_kernel=True)

    @pytest.mark.cuda
    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_prefill_then_decode_writes_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device, data,
                                                seed):
        self._engine_writes(backend_cls, backend_options, cuda_dtype, cuda_device, data, seed)

    @pytest.mark.cuda
    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_attention_matches_unquantized_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device,
                                                   data, seed):
        self._attention_check(backend_cls, backend_options, cuda_dtype, cuda_device, data, seed, core_kernel=False)

    @pytest.mark.cuda
    @suite_settings
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def test_core_kernel_attention_matches_unquantized_on_cuda(self, backend_cls, backend_options, cuda_dtype,
                                                               cuda_device, data, seed):
        self._attention_check(backend_cls, backend_options, cuda_dtype, cuda_device, data, seed, core_kernel=True)
