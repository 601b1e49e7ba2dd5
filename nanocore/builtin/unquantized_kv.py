"""``unquantized``: K and V stored in the model dtype. The KV-codec oracle."""
from __future__ import annotations

import torch

from nanocore.interfaces import KVCache, KVCodec, KVLayout, builtin_options
from nanocore.toolkit.kv import flat_slots, store_layout


class UnquantizedKVCodec(KVCodec):
    auto_priority = 0

    def __init__(self, options=None):
        super().__init__(builtin_options(self, UnquantizedKVCodec, "unquantized", options, {}))

    def layout(self, dtype: torch.dtype) -> KVLayout:
        return KVLayout(k_dtype=dtype, v_dtype=dtype)

    def store(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        store_layout(cache, k, v, slot_mapping, self.layout(k.dtype))  # the fused store on CUDA, its twin elsewhere

    def gather(self, cache: KVCache, slots: torch.Tensor, dtype: torch.dtype):
        return flat_slots(cache.k)[slots].to(dtype), flat_slots(cache.v)[slots].to(dtype)
