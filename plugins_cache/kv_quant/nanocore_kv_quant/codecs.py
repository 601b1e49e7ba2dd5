"""Dynamically scaled KV codecs. Each is a layout; storing and dequantizing are shared.

The quantizer is the toolkit's (``nanocore.toolkit.kv``): symmetric, ``scale = amax / qmax`` per
(token, head) or per group of head_dim, computed from the data at store time (1 only for an all-zero
vector, which then round-trips exactly). On CUDA the fused Triton store writes values and scales in one
launch; elsewhere its torch twin does, with the same numbers. ``gather`` is the dequantizing reference
the core attention reproduces when it reads these layouts natively.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from nanocore.interfaces import KVCache, KVCodec, KVLayout, check_options
from nanocore.interfaces.kv_codec import ScaleGranularity
from nanocore.toolkit.kv import gather_layout, store_layout


class ScaledKVCodec(KVCodec):
    """K and V stored in a narrow dtype with per-(token, head) or per-group scales."""

    auto_priority = None  # a lossy cache is chosen by name, never by "auto"
    conformance_requirements = {"scale_rule": "amax"}  # the toolkit's quantizer: scale = amax / qmax exactly
    k_dtype: ClassVar[torch.dtype]
    v_dtype: ClassVar[torch.dtype]
    k_scale: ClassVar[ScaleGranularity] = "token_head"
    v_scale: ClassVar[ScaleGranularity] = "token_head"
    group_size: ClassVar[int] = 0
    scale_dtype: ClassVar[torch.dtype] = torch.float32
    #: Bound on ``|gather(store(x)) - x|`` as a fraction of ``max |x|`` over each (token, head), measured.
    roundtrip_error: ClassVar[float]

    def __init__(self, options: dict | None = None):
        super().__init__(check_options(self.name or type(self).__name__, dict(options or {}), {}))

    def layout(self, dtype: torch.dtype) -> KVLayout:
        return KVLayout(k_dtype=self.k_dtype, v_dtype=self.v_dtype, k_scale=self.k_scale, v_scale=self.v_scale,
                        group_size=self.group_size, scale_dtype=self.scale_dtype)

    def store(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        store_layout(cache, k, v, slot_mapping, self.layout(k.dtype))

    def gather(self, cache: KVCache, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return gather_layout(cache, slots, dtype)


class Int8KVCodec(ScaledKVCodec):
    """``int8``: symmetric int8 K and V, one float32 scale per (token, head)."""

    k_dtype = v_dtype = torch.int8
    tolerance = (8e-2, 8e-2)  # measured worst 0.066 (short causal prefixes, keys at 4x unit scale)
    roundtrip_error = 0.008  # 0.5 / 127 = 0.0039, plus bf16 rounding of the dequantized value


class Fp8E4M3KVCodec(ScaledKVCodec):
    """``fp8_e4m3``: fp8 e4m3 K and V, one float32 scale per (token, head) computed from the data."""

    k_dtype = v_dtype = torch.float8_e4m3fn
    tolerance = (3e-1, 3e-1)  # measured worst 0.245: 3 mantissa bits on K and V
    roundtrip_error = 0.04  # half the e4m3 spacing at the top of the range, 16 / 448 = 0.036, plus bf16


class KInt8VFp8KVCodec(ScaledKVCodec):
    """``k_int8_v_fp8``: K int8 with a scale per group of 32 along head_dim, V fp8 e4m3 per (token, head);
    scales in float16. About 0.52x the bytes of a bf16 cache."""

    k_dtype = torch.int8
    v_dtype = torch.float8_e4m3fn
    k_scale = "group"
    group_size = 32
    scale_dtype = torch.float16
    tolerance = (1.2e-1, 1.2e-1)  # measured worst 0.091, set by the fp8 V
    roundtrip_error = 0.04  # fp8 V as for fp8_e4m3; the int8 K is within 0.008
