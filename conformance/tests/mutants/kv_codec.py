"""KV codecs the suite must accept (CORRECT) and reject (MUTANTS), written as third parties would: from the
``KVCodec`` interface or by subclassing the builtin oracle."""
from __future__ import annotations

import torch

from nanocore.interfaces import KVCache, KVCodec, KVLayout
from nanocore.toolkit.reference import UnquantizedKVCodec
from nanocore_conformance import KVCodecConformance, bind_all


def by_slot(cache_tensor: torch.Tensor) -> torch.Tensor:
    """``[blocks, block_size, ...]`` viewed as ``[slots, ...]``."""
    return cache_tensor.view(-1, *cache_tensor.shape[2:])


class PlainKVCodec(UnquantizedKVCodec):
    """The oracle itself, seen as a third party's class."""


class TinyInt8KVCodec(KVCodec):
    """A third party's int8 codec from the interface alone: one float32 scale per (token, head), amax / 127,
    round to nearest."""

    tolerance = (8e-2, 8e-2)

    def layout(self, dtype):
        return KVLayout(k_dtype=torch.int8, v_dtype=torch.int8, k_scale="token_head", v_scale="token_head")

    def quantize(self, x: torch.Tensor):
        scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale

    def store(self, cache: KVCache, k, v, slot_mapping):
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        for x, values, scales in ((k, cache.k, cache.k_scale), (v, cache.v, cache.v_scale)):
            q, scale = self.quantize(x[keep])
            by_slot(values)[slots] = q
            by_slot(scales)[slots] = scale

    def dequantize(self, values, scales, slots):
        return by_slot(values)[slots].float() * by_slot(scales)[slots]

    def gather(self, cache: KVCache, slots, dtype):
        return (self.dequantize(cache.k, cache.k_scale, slots).to(dtype),
                self.dequantize(cache.v, cache.v_scale, slots).to(dtype))


class AmaxInt8KVCodec(TinyInt8KVCodec):
    """Declares the toolkit's scale rule and keeps it: amax / 127, and 1 for an all-zero (token, head)."""

    conformance_requirements = {"scale_rule": "amax"}
    qmax = 127

    def quantize(self, x: torch.Tensor):
        amax = x.float().abs().amax(-1, keepdim=True)
        scale = torch.where(amax > 0, amax / self.qmax, torch.ones_like(amax))
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class WritesSlotMinusOne(UnquantizedKVCodec):
    """store writes slot -1 (Python's last slot) instead of skipping it."""

    def store(self, cache, k, v, slot_mapping):
        by_slot(cache.k)[slot_mapping] = k.to(cache.k.dtype)
        by_slot(cache.v)[slot_mapping] = v.to(cache.v.dtype)


class StoresAtMost128Dims(UnquantizedKVCodec):
    """A store kernel tiled for head dims up to 128: past that, the dims beyond 128 are never written."""

    def store(self, cache, k, v, slot_mapping):
        if k.shape[-1] <= 128:
            return super().store(cache, k, v, slot_mapping)
        keep = slot_mapping >= 0
        for x, values in ((k, cache.k), (v, cache.v)):
            by_slot(values)[slot_mapping[keep], :, :128] = x[keep][..., :128].to(values.dtype)


class WritesOneContiguousRun(UnquantizedKVCodec):
    """store writes the batch as one run of slots from the first one: right for a single in-order prefill,
    wrong for decode batches (one token per sequence, each in its own block) and scattered slots."""

    def store(self, cache, k, v, slot_mapping):
        keep = slot_mapping >= 0
        start, count = int(slot_mapping[keep][0]), int(keep.sum())
        by_slot(cache.k)[start:start + count] = k[keep].to(cache.k.dtype)
        by_slot(cache.v)[start:start + count] = v[keep].to(cache.v.dtype)


class SortsSlotsFirst(TinyInt8KVCodec):
    """store sorts slot_mapping (for coalesced writes) but keeps K/V in batch order: out-of-order batches land
    on the wrong slots."""

    def store(self, cache, k, v, slot_mapping):
        super().store(cache, k, v, slot_mapping.sort().values)


class DecodePathWrongBlock(UnquantizedKVCodec):
    """A fast path for small (decode) batches takes the block as slot // 16, the engine's default block size,
    and the offset within the block as slot % block_size: other block sizes write the wrong block."""

    def store(self, cache, k, v, slot_mapping):
        if k.shape[0] > 8:
            return super().store(cache, k, v, slot_mapping)
        for i, slot in enumerate(slot_mapping.tolist()):
            if slot >= 0:
                cache.k[slot // 16, slot % cache.block_size] = k[i]
                cache.v[slot // 16, slot % cache.block_size] = v[i]


class FirstTokenScales(TinyInt8KVCodec):
    """store computes the per-head scales from the batch's first token and uses them for every token: right for
    one-token batches, clipping or imprecise for the rest."""

    def store(self, cache, k, v, slot_mapping):
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        for x, values, scales in ((k[keep], cache.k, cache.k_scale), (v[keep], cache.v, cache.v_scale)):
            _, scale = self.quantize(x[:1])
            by_slot(values)[slots] = torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8)
            by_slot(scales)[slots] = scale.expand(len(x), -1, -1)


class ScaleStoredTwiceGatherHalves(TinyInt8KVCodec):
    """store writes twice the scale and gather halves it back: gather round-trips, but the core attention reads
    the stored scale and is off by 2x."""

    def store(self, cache, k, v, slot_mapping):
        super().store(cache, k, v, slot_mapping)
        keep = slot_mapping >= 0
        for scales in (cache.k_scale, cache.v_scale):
            by_slot(scales)[slot_mapping[keep]] *= 2

    def dequantize(self, values, scales, slots):
        return super().dequantize(values, scales, slots) / 2


class HeadsReversed(UnquantizedKVCodec):
    """store writes the KV heads in reverse order (a transposed layout of its own) and gather flips them back:
    the core attention pairs query heads with the wrong KV heads."""

    def store(self, cache, k, v, slot_mapping):
        super().store(cache, k.flip(1), v.flip(1), slot_mapping)

    def gather(self, cache, slots, dtype):
        k, v = super().gather(cache, slots, dtype)
        return k.flip(1), v.flip(1)


class GroupScalesUnderTokenHeadLayout(TinyInt8KVCodec):
    """layout() declares one scale per (token, head), but allocate / store / gather keep one per 32 elements of
    head_dim (bytes_per_token follows the allocation): the core attention reads only the first group's scale."""

    group = 32

    def allocate(self, num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
        cache = super().allocate(num_blocks, block_size, num_kv_heads, head_dim, dtype, device)
        shape = (num_blocks, block_size, num_kv_heads, head_dim // self.group)
        cache.k_scale, cache.v_scale = torch.ones(shape, device=device), torch.ones(shape, device=device)
        return cache

    def bytes_per_token(self, num_kv_heads, head_dim, dtype):
        return 2 * num_kv_heads * (head_dim + 4 * (head_dim // self.group))

    def quantize(self, x):
        t, h, d = x.shape
        q, scale = super().quantize(x.reshape(t, h * d // self.group, self.group))
        return q.view(t, h, d), scale.view(t, h, d // self.group)

    def dequantize(self, values, scales, slots):
        q, s = by_slot(values)[slots].float(), by_slot(scales)[slots]
        return (q.unflatten(-1, (s.shape[-1], -1)) * s[..., None]).flatten(-2)


class TruncatesToInt8(TinyInt8KVCodec):
    """store rounds toward zero (a plain .to(torch.int8)) instead of to nearest: up to a whole step of error."""

    def quantize(self, x):
        scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
        return (x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class ScaleClipsLargest(TinyInt8KVCodec):
    """scale = amax / 128: the largest element of every (token, head) clips to 127."""

    def quantize(self, x):
        scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 128
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class QmaxOffByOne(AmaxInt8KVCodec):
    """Declares scale_rule "amax" but divides by 126: every value fits, but the scales are not the declared ones."""

    qmax = 126


class ZeroGroupScaleNotOne(AmaxInt8KVCodec):
    """Declares scale_rule "amax" but gives an all-zero (token, head) the smallest float32 scale instead of 1 (the
    zeros still read back as zeros)."""

    def quantize(self, x):
        amax = x.float().abs().amax(-1, keepdim=True)
        scale = (amax / 127).clamp_min(torch.finfo(torch.float32).smallest_normal * torch.finfo(torch.float32).eps)
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class ScaleFloorAtEps(TinyInt8KVCodec):
    """Floors the scale at float32's eps (1.2e-7) rather than its smallest subnormal: a token with max|x| 2e-6 uses
    only 17 of int8's 127 steps."""

    def quantize(self, x):
        scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
        scale = scale.clamp_min(torch.finfo(torch.float32).eps)
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class Fp16ScalesWithoutFloor(TinyInt8KVCodec):
    """float16 scales with no floor: a tiny token's amax / 127 rounds to a 0 scale, and its values read back as 0."""

    def layout(self, dtype):
        return KVLayout(k_dtype=torch.int8, v_dtype=torch.int8, k_scale="token_head", v_scale="token_head",
                        scale_dtype=torch.float16)

    def quantize(self, x):
        scale = (x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127).half().float()
        return torch.round(x.float() / scale).clamp(-127, 127).nan_to_num(0).to(torch.int8), scale.half()

    def dequantize(self, values, scales, slots):
        return by_slot(values)[slots].float() * by_slot(scales)[slots].float()


class GatherUsesFirstHeadScale(TinyInt8KVCodec):
    """gather dequantizes every head with head 0's scale."""

    def dequantize(self, values, scales, slots):
        return by_slot(values)[slots].float() * by_slot(scales)[slots][:, :1]


class BytesWithoutScales(TinyInt8KVCodec):
    """bytes_per_token counts the int8 values but not the float32 scales: the engine over-commits KV memory."""

    def bytes_per_token(self, num_kv_heads, head_dim, dtype):
        return 2 * num_kv_heads * head_dim


class AccumulatesIntoSlots(UnquantizedKVCodec):
    """store adds into the cache (index_add_): right on a freshly zeroed cache, wrong when a slot is written
    again (recompute after preemption, a reused block)."""

    def store(self, cache, k, v, slot_mapping):
        keep = slot_mapping >= 0
        by_slot(cache.k).index_add_(0, slot_mapping[keep], k[keep].to(cache.k.dtype))
        by_slot(cache.v).index_add_(0, slot_mapping[keep], v[keep].to(cache.v.dtype))


CORRECT = [PlainKVCodec, TinyInt8KVCodec, AmaxInt8KVCodec]
MUTANTS = [StoresAtMost128Dims, WritesSlotMinusOne, WritesOneContiguousRun, SortsSlotsFirst, DecodePathWrongBlock,
           FirstTokenScales,
           ScaleStoredTwiceGatherHalves, HeadsReversed, GroupScalesUnderTokenHeadLayout, TruncatesToInt8,
           ScaleClipsLargest, GatherUsesFirstHeadScale, BytesWithoutScales, AccumulatesIntoSlots, QmaxOffByOne,
           ZeroGroupScaleNotOne, ScaleFloorAtEps, Fp16ScalesWithoutFloor]
bind_all(globals(), KVCodecConformance, CORRECT + MUTANTS)
