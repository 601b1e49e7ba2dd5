"""Explicit KV-codec cases on every run: every slot position a block has (its first, its last, a chunk padded with
-1 at the tail), head dims 64 / 128 / 256, rewrites of written slots, and a long context across many blocks. Each
store is checked against the declared layout as the random programs are, then ``gather`` against the raw cache."""
from __future__ import annotations

import pytest
import torch

from nanocore_conformance.base import assert_close, generator
from nanocore_conformance.compat import targeted_minor, warn_legacy
from nanocore_conformance.kv_codec_cases import ShadowCache
from nanocore_conformance.kv_codec_layout import check_allocation, read_like_core

#: The plugin API minor that added the all-zero and tiny groups case.
TINY_GROUPS_SINCE = (1, 6)
BOUNDARY_HEAD_DIMS = (64, 128, 256)
#: Blocks of the long context (a 384-token sequence at block size 16).
LONG_BLOCKS = 24


def boundary_programs(block_size: int, num_blocks: int) -> list[tuple[str, list[int]]]:
    """(name, slot_mapping) of each store, in order."""
    bs, last = block_size, num_blocks * block_size
    blocks = list(range(num_blocks))[::-1]  # a sequence's blocks in another order than their ids
    return [
        ("the first slot of every block", [b * bs for b in blocks]),
        ("the last slot of every block", [b * bs + bs - 1 for b in blocks]),
        ("a chunk ending mid-block, padded with -1", [blocks[1] * bs + i for i in range(bs - 1)] + [-1] * 3),
        (f"a long context over {num_blocks} blocks", [b * bs + i for b in blocks for i in range(bs)]),
        ("rewrites of first and last slots", [b * bs + o for b in blocks[::3] for o in (0, bs - 1)] + [-1]),
        ("one decode token in the last slot", [last - 1]),
    ]


def zero_and_tiny_tokens(heads: int, head_dim: int, dtype, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of six tokens, each side: all zeros; head 0 all zeros beside a unit-scale head; max|x| 2e-6 (amax /
    qmax under a float16 scale's smallest subnormal: the scale stays at that floor); a unit-scale token; the first
    half of head_dim zeros (an all-zero scale group); a token at 100 times unit scale."""
    g = generator(seed)
    sides = []
    for _ in "KV":
        x = torch.randn(6, heads, head_dim, generator=g)
        x[0] = 0
        x[1, 0] = 0
        x[2] *= 2e-6 / x[2].abs().max()
        x[4, :, :head_dim // 2] = 0
        x[5] *= 100
        sides.append(x.to(dtype=dtype, device=device))
    return sides[0], sides[1]


class KVCodecBoundaryConformance:
    """The cases as a check of ``KVCodecConformance`` (``head_dims`` declared by a codec replace 64 / 128 / 256)."""

    def test_boundary_slots_head_dims_and_long_context(self, backend_cls, backend_options, dtype, device):
        declared = type(self).__dict__.get("head_dims") or self.__dict__.get("head_dims")
        for head_dim in declared or BOUNDARY_HEAD_DIMS:
            for block_size in self.block_sizes:
                codec = backend_cls(backend_options)
                layout = codec.layout(dtype)
                cache = codec.allocate(LONG_BLOCKS, block_size, 1, head_dim, dtype, device)
                check_allocation(cache, layout, LONG_BLOCKS, block_size, 1, head_dim)
                shadow = ShadowCache(codec, cache, layout, seed=head_dim + block_size, scale_rule=self.scale_rule)
                for name, mapping in boundary_programs(block_size, LONG_BLOCKS):
                    shadow.store(f"head_dim {head_dim}, block size {block_size}: {name}", mapping, dtype)
                slots = torch.randperm(LONG_BLOCKS * block_size, generator=generator(head_dim))[:64].to(device)
                for side, got, want in zip("KV", codec.gather(cache, slots, dtype), read_like_core(cache, slots)):
                    assert_close(got, want.to(dtype), (1e-30, 2 * torch.finfo(dtype).eps),
                                 f"head_dim {head_dim}, block size {block_size}: gather {side} differs from the raw "
                                 f"cache dequantized per the declared layout")

    def test_all_zero_and_tiny_groups(self, backend_cls, backend_entry, backend_options, dtype, device):
        """All-zero tokens, heads and scale groups store zeros (a finite scale, no NaN); tiny tokens keep their
        precision: a scale floor above the scale dtype's smallest subnormal wastes it, none at all stores 0 or inf.
        A case of plugin API 1.6: a codec written for an older API is spared it and warned."""
        if targeted_minor(backend_cls, backend_entry) < TINY_GROUPS_SINCE:
            warn_legacy(backend_cls, "written for a plugin API before 1.6, whose suite never stored all-zero or tiny "
                        "groups; declare api_version = \"1.6\" once they store finite scales at least the scale "
                        "dtype's smallest subnormal and no larger than 2 * max|x| / qmax")
            pytest.skip(f"{backend_cls.__name__} targets a plugin API before 1.6 (all-zero and tiny groups)")
        head_dim = 64 if 64 in self.head_dims else self.head_dims[0]
        codec = backend_cls(backend_options)
        layout = codec.layout(dtype)
        cache = codec.allocate(2, 4, 2, head_dim, dtype, device)
        check_allocation(cache, layout, 2, 4, 2, head_dim)
        shadow = ShadowCache(codec, cache, layout, seed=head_dim, scale_rule=self.scale_rule)
        # -1 pads a batch as a decode step's CUDA graph does; each kind of token is stored by one of the two
        for name, mapping in (("zero and tiny tokens, one padded", [3, 0, 6, -1, 5, 1]),
                              ("the same tokens rewritten elsewhere", [2, 7, 4, 0, -1, 3])):
            k, v = zero_and_tiny_tokens(2, head_dim, dtype, device, seed=len(name))
            shadow.store(f"head_dim {head_dim}: {name}", mapping, dtype, (k, v))
