"""Launch parameters of the per-channel GEMMs of :mod:`nanocore.toolkit.gemm` and the measured-best choice per shape.

:class:`GemmConfig` names a kernel (``gemv``, ``splitk`` or ``tiled``) and its tiles. :func:`default_config` picks
by M (split-K up to ``DECODE_MAX_M``, the tiled GEMM beyond; the block-scaled GEMM uses it),
:func:`weight_only_config` the same with split-K kept up to ``SPLITK_MAX_M`` (per-channel fp8 / int8 weights), and
:func:`int8_int8_config` the int8-activation tiles. All of it is re-exported by :mod:`nanocore.toolkit.gemm`.
"""
from __future__ import annotations

from dataclasses import dataclass

from nanocore.toolkit.kernel_plan import KERNEL_PLANS, kernel_for

try:
    import triton
except ImportError:  # CPU-only installs use the torch reference
    triton = None

#: M at or below which ``default_config`` picks the split-K decode kernel instead of the tiled GEMM.
DECODE_MAX_M = 16
#: M up to which the split-K kernels accept a config (since 1.4): one row tile holds every token, so each weight
#: byte is read once; which M runs them is ``kernel_plan.KERNEL_PLANS``.
SPLITK_MAX_M = 32


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of one kernel variant."""
    #: "gemv" (M = 1, CUDA cores), "splitk" (decode, tensor cores), "tiled" (GEMM), "mma" (mixed-input tensor-core
    #: tiles, gemm_mma), or the library GEMMs "dequant" / "scaled_mm" (no tiles; see kernel_plan)
    kind: str = "splitk"
    block_m: int = 1  # splitk: 1-2 reduce with FMAs, >= 16 with tl.dot
    block_n: int = 32
    block_k: int = 256
    split_k: int = 0  # splitk: K slices; 0 picks enough for ~4 programs per SM
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8  # tiled: row tiles that share weight tiles in L2
    fp8_native: bool | None = None  # None: native where the GPU converts fp8 (sm_89+)
    reduce_late: bool = True  # gemv: one cross-thread reduction after the K loop (else one per tile)
    int8_magic: bool = True  # gemv: int8 by the exponent trick (else the int-to-float conversion); see int8_prmt
    int8_prmt: bool = True  # gemv on a GPU, with int8_magic: byte permutes (inline PTX) instead of the trick + add
    swap_ab: bool = True  # mma: the weight tile is the dot's first operand (tensor cores read it from registers)
    fast_widen: bool = True  # mma: int8 widened by the exponent trick (an XOR and a subtraction, no int-to-float)


def default_config(m: int, n: int, k: int) -> GemmConfig:
    """The measured-best variant for an ``[m, k] x [k, n]`` shape (tune_linear_gpu.py picks these)."""
    if m == 1:
        # CUDA cores, 16 rows x 512 K per tile, reduced per tile (56 registers, 56% occupancy): on the H200
        # 0.087 ms per 7B layer (fp8, graph-replayed) against 0.116 for the tensor-core split-K below
        return GemmConfig("gemv", block_m=1, block_n=16, block_k=512, num_warps=8, num_stages=1, reduce_late=False)
    if m <= DECODE_MAX_M:
        # BLOCK_M 16 (tensor-core dot, padding rows masked) even for M = 1: on the H200 graph-replayed int8
        # decode took 0.117 ms per 7B layer at M = 16 but 0.255 ms at M = 1 on the multiply-add path (bf16 0.16)
        return GemmConfig("splitk", block_m=16, block_n=32, block_k=256)
    if m <= 64:
        return GemmConfig("tiled", block_m=triton.next_power_of_2(max(m, 16)) if m < 64 else 64, block_n=64,
                          block_k=128, num_warps=4, num_stages=4)
    if m <= 256:
        return GemmConfig("tiled", block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
    return GemmConfig("tiled", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)


#: mma tiles per weight format and M bucket: (largest M, block_m, block_n, block_k, warps, stages), the fastest of
#: ``nanocore tune linear`` (docs/benchmarks-quant.md).
MMA_TILES = {
    "int8_channel": ((64, 64, 128, 128, 4, 4), (256, 128, 128, 64, 8, 4), (None, 128, 128, 64, 8, 4)),
    "fp8_channel": ((64, 64, 128, 128, 4, 4), (256, 128, 128, 64, 8, 4), (None, 128, 128, 64, 8, 4)),
    "int4_group": ((64, 64, 128, 128, 4, 4), (256, 128, 128, 64, 8, 4), (None, 128, 128, 64, 8, 4)),
}


def mma_config(m: int, n: int, k: int, fmt: str = "int8_channel") -> GemmConfig:
    """The mixed-input tensor-core tiles of weight format ``fmt`` for ``m`` tokens (``block_m`` counts tokens,
    ``block_n`` weight rows)."""
    for largest, bm, bn, bk, warps, stages in MMA_TILES[fmt]:
        if largest is None or m <= largest:
            return GemmConfig("mma", block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
    raise AssertionError("MMA_TILES ends with an unbounded row")


def weight_only_config(m: int, n: int, k: int, fmt: str = "int8_channel") -> GemmConfig:
    """The config of the kernel that weight format ``fmt``'s plan (``kernel_plan.KERNEL_PLANS``) runs at ``m``: the
    M = 1 GEMV, the split-K decode tiles (``block_m`` is rounded up to M by the launcher), the mma tiles, or a
    library GEMM."""
    kernel = kernel_for(KERNEL_PLANS[fmt], m)
    if kernel == "gemv":
        return default_config(1, n, k)
    if kernel in ("splitk", "cuda_gemv"):
        return default_config(min(max(m, 2), DECODE_MAX_M), n, k)
    if kernel == "mma":
        return mma_config(m, n, k, fmt)
    return GemmConfig(kernel)


def int8_int8_config(m: int, n: int, k: int) -> GemmConfig:
    """int8 x int8 tiles: from M = 256 the 128 x 128 x 128 / 8-warp tile, fastest in the H200 sweep
    (tune_linear_h200.json, 7B layer: M = 256 0.233 vs 0.281 ms, 1024 0.432 vs 0.584, 4096 1.564 vs 2.081)."""
    if m >= 256:
        return GemmConfig("tiled", block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3)
    return default_config(m, n, k)
