"""KVCodec: how the paged KV cache stores keys and values.

Cache tensors are per layer. Keys and values are stored as ``[num_blocks, block_size, num_kv_heads,
head_dim]`` in the layout's ``k_dtype`` / ``v_dtype``; a slot is ``block_id * block_size + offset``. Scales,
when the layout has them, are ``[num_blocks, block_size, num_kv_heads, num_scale_groups]`` in ``scale_dtype``:
one per (token, head) for ``"token_head"``, one per ``group_size`` elements of head_dim for ``"group"``.
The stored value times its scale is the dequantized value. That is the whole contract between a codec and the
core's attention: on CUDA the Triton attention reads the raw tensors through ``layout()`` and never calls
``gather``; ``gather`` is the dequantizing reference (the CPU path uses it) and must return exactly what the
layout says. The conformance suite checks both, and runs the core kernel (interpreted on CPU) on your cache.

Calls, per layer: ``layout`` and ``bytes_per_token`` at start-up (KV sizing), ``allocate`` once, ``store`` on
every forward with that step's new tokens, ``gather`` only on the CPU reference path.

``conformance_requirements`` a codec may declare (a class attribute dict, applied by every conformance class):
``{"head_dims": (128,), "block_sizes": (16,)}``, the head dims and block sizes it supports (defaults (32, 64, 128)
and (4, 16)); ``{"scale_rule": "amax"}`` when every scale is exactly the toolkit quantizer's (``store_layout``):
max|x| of its group / qmax (127 for int8, 448 for fp8 e4m3) in ``scale_dtype``, never below that dtype's smallest
subnormal, and 1 for an all-zero group (default None: any scale the ``store`` rule below allows).
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from nanocore.interfaces.base import Backend

ScaleGranularity = Literal["none", "token_head", "group"]


@dataclass(frozen=True)
class KVLayout:
    k_dtype: torch.dtype
    v_dtype: torch.dtype
    k_scale: ScaleGranularity = "none"
    v_scale: ScaleGranularity = "none"
    #: Elements of head_dim sharing one scale when a granularity is "group".
    group_size: int = 0
    scale_dtype: torch.dtype = torch.float32

    def num_scale_groups(self, granularity: ScaleGranularity, head_dim: int) -> int:
        if granularity == "none":
            return 0
        if granularity == "token_head":
            return 1
        if not self.group_size or head_dim % self.group_size:
            raise ValueError(f"this KV layout scales per group of {self.group_size} along head_dim, but head_dim is "
                             f"{head_dim}: use a codec with one scale per token and head, or a group size that "
                             f"divides head_dim")
        return head_dim // self.group_size


@dataclass
class KVCache:
    """One layer's cache tensors. ``k_scale`` / ``v_scale`` are None when the layout has no scales."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]


class KVCodec(Backend):
    """Constructor: ``__init__(self, options: dict | None = None)`` with the user's ``kv_codec_options``."""

    #: (atol, rtol) of attention over this cache against the unquantized oracle.
    tolerance: ClassVar[tuple[float, float]] = (1e-5, 1e-5)

    @abstractmethod
    def layout(self, dtype: torch.dtype) -> KVLayout:
        """Storage layout when the model computes in ``dtype`` (a pure function of ``dtype`` and the options)."""

    def bytes_per_token(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one token occupies in one layer's cache (K, V and their scales): what ``allocate`` allocates per
        slot, exactly (KV sizing divides free memory by it)."""
        layout = self.layout(dtype)
        total = 0
        for store_dtype, granularity in ((layout.k_dtype, layout.k_scale), (layout.v_dtype, layout.v_scale)):
            total += num_kv_heads * head_dim * store_dtype.itemsize
            total += num_kv_heads * layout.num_scale_groups(granularity, head_dim) * layout.scale_dtype.itemsize
        return total

    def allocate(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> KVCache:
        """Allocate one layer's cache: exactly the contiguous tensors ``layout`` declares (a layout that does not fit
        ``head_dim`` is an error naming this codec)."""
        layout = self.layout(dtype)
        for granularity in (layout.k_scale, layout.v_scale):
            try:
                layout.num_scale_groups(granularity, head_dim)
            except ValueError as exc:
                raise ValueError(f"KV codec {self.name!r}: {exc}") from None
        shape = (num_blocks, block_size, num_kv_heads, head_dim)

        def scales(granularity: ScaleGranularity) -> torch.Tensor | None:
            groups = layout.num_scale_groups(granularity, head_dim)
            if groups == 0:
                return None
            return torch.ones(num_blocks, block_size, num_kv_heads, groups, dtype=layout.scale_dtype, device=device)

        return KVCache(
            k=torch.zeros(shape, dtype=layout.k_dtype, device=device),
            v=torch.zeros(shape, dtype=layout.v_dtype, device=device),
            k_scale=scales(layout.k_scale),
            v_scale=scales(layout.v_scale),
        )

    @abstractmethod
    def store(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write ``k``, ``v`` ``[num_tokens, num_kv_heads, head_dim]`` (model dtype, possibly strided views of the
        qkv projection) at ``slot_mapping`` ``[num_tokens]`` (int64); slot -1 (padding) is skipped and leaves the
        cache untouched. Slots come in any order, with gaps: a decode step writes one token per sequence, a
        prefill chunk a run of slots, and a slot may be written again later. Every other slot must keep its
        values and scales. On CUDA ``store`` runs inside captured CUDA graphs: no host synchronisation, no
        data-dependent shapes (no boolean-mask indexing), no allocation that depends on the data
        (``nanocore.toolkit.kv.store_layout`` does all this for layouts of this family). Quantized values are
        rounded to nearest in the stored dtype, without clipping, with a scale of at most 2 * amax / qmax of
        what it scales, or the scale dtype's smallest subnormal where that is smaller, and any finite scale for an
        all-zero group (the conformance suite checks the raw tensors against this rounding)."""

    @abstractmethod
    def gather(self, cache: KVCache, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized ``(k, v)`` of shape ``[len(slots), num_kv_heads, head_dim]`` in ``dtype``: stored value times
        scale per ``layout()``, nothing else (``nanocore.toolkit.kv.gather_layout``). Reference path only."""
