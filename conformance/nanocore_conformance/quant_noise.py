"""The rounding noise a declared ``QuantScheme`` allows: the linear suite's tolerance comes from the format.

Rounding to a grid of step ``s`` adds an error uniform in ``[-s/2, s/2]`` (variance ``s^2 / 12``), so the
output error of ``y = x W^T`` has std ``sqrt(sum_k x_k^2 s_w[n,k]^2 / 12 + sum_k W[n,k]^2 s_x[m,k]^2 / 12)``.
The steps follow from the scheme and the very tensors rounded: int N-bit symmetric ``max|block| / (2^(N-1)-1)``,
asymmetric ``range / (2^N - 1)``, fp8 e4m3 ``|v| 2^-3`` (3 mantissa bits, subnormals below ``2^-6`` of the scale).
"""
from __future__ import annotations

import torch

from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme

FP8_MAX = 448.0
FP8_MANTISSA_BITS = 3
FP8_MIN_NORMAL_EXP = -6
#: Allowed |error| = NOISE_SIGMAS x predicted std (+ float accuracy): measured on random shapes, correct
#: in-tree methods stay below 5.5; a shuffled shard, a dropped zero point or a per-tensor scale go far past it.
NOISE_SIGMAS = 7.0


def _reduce_blocks(values: torch.Tensor, args: QuantArgs, reduce) -> torch.Tensor:
    """``reduce`` (amax / amin over a dim, keepdim) over each scale's block of ``values [R, C]``, broadcast back."""
    rows, cols = values.shape
    if args.strategy == "tensor":
        return reduce(reduce(values, 1), 0).expand(rows, cols)
    if args.strategy in ("channel", "token"):
        return reduce(values, 1).expand(rows, cols)
    if args.strategy == "group":
        size = args.group_size
        if cols % size:
            raise ValueError(f"quant_scheme() declares group_size {size}, which does not divide the input size {cols}")
        return reduce(values.reshape(rows, cols // size, size), 2).expand(-1, -1, size).reshape(rows, cols)
    if args.strategy == "block":
        block_rows, block_cols = args.block_structure
        if rows % block_rows or cols % block_cols:
            raise ValueError(f"quant_scheme() declares blocks {args.block_structure}, which do not tile the weight "
                             f"{tuple(values.shape)}; declare conformance_requirements for the sizes you need")
        tiles = values.reshape(rows // block_rows, block_rows, cols // block_cols, block_cols)
        tiles = reduce(reduce(tiles, 3), 1)
        return tiles.expand(-1, block_rows, -1, block_cols).reshape(rows, cols)
    raise ValueError(f"quant_scheme() has strategy {args.strategy!r}, which the suite does not know")


def _amax(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.amax(dim=dim, keepdim=True)


def _amin(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.amin(dim=dim, keepdim=True)


def rounding_step(values: torch.Tensor, args: QuantArgs) -> torch.Tensor:
    """Per-element grid step (float64) of ``values [R, C]`` rounded as ``args`` says (rows: output channels
    for weights, tokens for activations; blocks run along the columns)."""
    v = values.double()
    if args.type == "float":
        scale = (_reduce_blocks(v.abs(), args, _amax) / FP8_MAX).clamp_min(1e-30)
        # a scale search may pick up to twice absmax / 448: allow the larger subnormal step
        subnormal = 2 * scale * 2.0 ** (FP8_MIN_NORMAL_EXP - FP8_MANTISSA_BITS)
        return torch.maximum(v.abs() * 2.0 ** -FP8_MANTISSA_BITS, subnormal)
    if args.symmetric:
        return _reduce_blocks(v.abs(), args, _amax) / (2 ** (args.num_bits - 1) - 1)
    hi = _reduce_blocks(v, args, _amax).clamp_min(0)
    lo = _reduce_blocks(v, args, _amin).clamp_max(0)
    return (hi - lo) / (2 ** args.num_bits - 1)


def weight_step(weight: torch.Tensor, scheme: QuantScheme | None) -> torch.Tensor:
    """Step of each element of one checkpoint tensor ``[N, K]`` (zeros where weights are not rounded)."""
    if scheme is None or scheme.weights is None:
        return torch.zeros_like(weight, dtype=torch.float64)
    return rounding_step(weight, scheme.weights)


def predicted_std(x: torch.Tensor, weight: torch.Tensor, step_w: torch.Tensor,
                  scheme: QuantScheme | None) -> torch.Tensor:
    """Std of ``apply``'s rounding error for ``x [M, K]`` and this rank's ``weight [N, K]`` (steps ``step_w``)."""
    x, weight = x.float(), weight.float()  # float32 GEMMs: a std needs no more, and float64 ones are slow
    var = (x ** 2) @ (step_w.float() ** 2).t() / 12
    activations = scheme.input_activations if scheme is not None else None
    if activations is not None:
        step_x = rounding_step(x, activations)
        var = var + (step_x.float() ** 2) @ (weight ** 2).t() / 12
    return var.double().sqrt()


def float_slack(x: torch.Tensor, weight: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What float arithmetic alone may differ by: rounding in ``dtype`` of the weights and output, and a
    float32 accumulation over K in another order."""
    x, weight = x.float(), weight.float()
    spread = ((x ** 2) @ (weight ** 2).t()).sqrt()
    magnitude = x.abs() @ weight.abs().t()
    eps = torch.finfo(dtype).eps
    slack = eps * (2 * expected.double().abs() + 2 * spread.double())
    return slack + 16 * torch.finfo(torch.float32).eps * magnitude.double()
