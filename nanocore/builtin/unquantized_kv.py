"""``unquantized``: K and V stored in the model dtype. The KV-codec oracle."""
from __future__ import annotations

import torch

from nanocore.interfaces import KVCache, KVCodec, KVLayout, builtin_options
from nanocore.kernels import attention_dispatch
from nanocore.toolkit.kv import flat_slots


class UnquantizedKVCodec(KVCodec):
    auto_priority = 0

    def __init__(self, options=None):
        super().__init__(builtin_options(self, UnquantizedKVCodec, "unquantized", options, {}))

    def layout(self, dtype: torch.dtype) -> KVLayout:
        return KVLayout(k_dtype=dtype, v_dtype=dtype)

    def store(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if k.is_cuda and attention_dispatch.available():  # one fused launch, no host sync (graph-safe)
            attention_dispatch.store_kv(cache, k, v, slot_mapping, self.layout(k.dtype))
            return
        valid = slot_mapping >= 0
        slots = slot_mapping[valid]
        flat_slots(cache.k)[slots] = k[valid].to(cache.k.dtype)
        flat_slots(cache.v)[slots] = v[valid].to(cache.v.dtype)

    def gather(self, cache: KVCache, slots: torch.Tensor, dtype: torch.dtype):
        return flat_slots(cache.k)[slots].to(dtype), flat_slots(cache.v)[slots].to(dtype)
