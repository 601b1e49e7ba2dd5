"""Random paged-attention cases and the kernel-vs-reference check shared by the attention kernel tests (CPU
interpreter and cuda)."""
from __future__ import annotations

import torch

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec, flat_slots
from nanocore.interfaces import KVCodec, KVLayout
from nanocore.kernels.paged_attention import paged_attention
from nanocore.layers.attention import AttentionMetadata, paged_attention_reference

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
#: The scaled one-byte layouts every cuda test of the attention and KV-store kernels runs.
CUDA_SCALED_LAYOUTS = [QUANT_LAYOUTS["int8"], QUANT_LAYOUTS["fp8"],
                       KVLayout(I8, I8, "group", "token_head", group_size=32)]
