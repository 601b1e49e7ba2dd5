"""Explicit boundary cases for linear methods, run on every run whatever the random seed.

A backend may switch kernels by the number of rows M (GEMV at 1, split-K for a few rows, tensor-core tiles of 64 or
128 rows from prefill sizes on) and treat the bias differently on each path, so every M the engine uses is a case:
1 (a decode step of one sequence), 2, a non-multiple of 16, 65 (one past 64), 150 and 300 (partial tiles past 128),
512 (a prefill chunk). Each M runs with and without the q/k/v bias, as a 2-D and a 3-D input, with K spanning 2 and 8
quantization groups, on one and two tensor-parallel ranks: pairwise, not as the full product. Each case runs through
``apply`` of one of a decoder layer's linears loaded as the random draws are: the biased, merged q/k/v with its bias,
else the merged gate/up or the row-parallel o.
A backend declaring the M at which it switches kernels (``conformance_requirements = {"m_thresholds": (16, 128)}``)
also gets a case on each side of each threshold.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest
import torch

from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore_conformance.base import generator
from nanocore_conformance.linear_layers import (ROW_PARALLEL, LayerShape, build_layers, checkpoint_weights,
                                                load_checkpoint, random_activations, split_name)
from nanocore_conformance.quant_noise import weight_step

BOUNDARY_MS = (1, 2, 13, 65, 150, 300, 512)


@dataclass(frozen=True)
class BoundaryCase:
    m: int
    bias: bool
    three_d: bool
    num_groups: int
    tp_size: int

    def leading(self) -> list[int]:
        """x's leading dims: ``[M]``, or ``[2, M / 2]`` (``[M, 1]`` for odd M: a batch of single rows)."""
        if not self.three_d:
            return [self.m]
        return [2, self.m // 2] if self.m % 2 == 0 else [self.m, 1]

    def label(self, k: int, group: int) -> str:
        shape = "x".join(map(str, self.leading()))
        return (f"boundary case M={self.m} (x [{shape}, K]), {'with' if self.bias else 'no'} bias, "
                f"K of q/k/v and gate/up = {k} ({k // group} groups of {group}), tp {self.tp_size}")


def boundary_cases(thresholds=()) -> list[BoundaryCase]:
    """Each M twice (bias on and off); the other dimensions alternate so every pair of values meets."""
    ms = sorted({*BOUNDARY_MS, *(m for t in thresholds for m in (t - 1, t, t + 1) if m >= 1)})
    cases = []
    for i, m in enumerate(ms):
        flip = i % 2 == 1
        cases.append(BoundaryCase(m, True, flip, 8 if flip else 2, 2 if i % 4 < 2 else 1))
        cases.append(BoundaryCase(m, False, not flip, 2 if flip else 8, 1 if i % 4 < 2 else 2))
    return cases


def group_size(scheme, k_multiple: int) -> int:
    """Inputs per quantization group: the scheme's group or block width, else the declared K multiple (at least 16)."""
    weights = getattr(scheme, "weights", None)
    if weights is not None and weights.strategy == "group" and weights.group_size:
        return weights.group_size
    if weights is not None and weights.strategy == "block" and weights.block_structure:
        return weights.block_structure[1]
    return max(16, k_multiple)


def boundary_shape(num_groups: int, tp_size: int, group: int, unit: int) -> LayerShape:
    """A small decoder layer with q/k/v bias whose hidden size (K of q/k/v and gate/up) is ``num_groups`` groups;
    every other size is one group (or the backend's size unit), the least it allows, so 512 rows stay cheap."""
    base = math.lcm(unit, group)
    return LayerShape(hidden=num_groups * base, head_dim=base, num_heads=2, num_kv_heads=1,
                      intermediate=tp_size * base, qkv_bias=True)


def boundary_layer(case: BoundaryCase, index: int) -> str:
    """The layer a case runs through: the biased, merged q/k/v with the bias; else the merged gate/up or the
    row-parallel o (no bias: it is added after the all-reduce), alternately."""
    return "qkv_proj" if case.bias else ("gate_up_proj", "o_proj")[index // 2 % 2]


def bad_rows(bad) -> str:
    """``bad [M, N]`` (True where an output is out of bounds) -> "rows 128..149" / "row 0" / "rows 3, 70, 71"."""
    rows = bad.any(dim=1).nonzero().flatten().tolist()
    if len(rows) == 1:
        return f"row {rows[0]}"
    if rows[-1] - rows[0] + 1 == len(rows):
        return f"rows {rows[0]}..{rows[-1]}"
    shown = ", ".join(map(str, rows[:6]))
    return f"rows {shown}{', ...' if len(rows) > 6 else ''}"


@contextmanager
def one_thread():
    """Run the cases' small GEMMs on one thread (more gain nothing at these sizes, and spin on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LinearBoundaryConformance:
    """The boundary cases as checks of ``LinearMethodConformance`` (which supplies ``_checkpoint`` and ``_compare``).
    Cases sharing a layer shape share its checkpoint and loaded layers; each M runs the bias case through q/k/v
    (merged, biased) and down (row-parallel), the other through gate/up (merged) and o (row-parallel)."""

    def test_boundary_cases_match_unquantized(self, backend_cls, backend_options, dtype, device):
        self._check_boundary_cases(backend_cls, backend_options, dtype, device)

    @pytest.mark.cuda
    def test_boundary_cases_match_unquantized_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device):
        self._check_boundary_cases(backend_cls, backend_options, cuda_dtype, cuda_device)

    def _check_boundary_cases(self, backend_cls, options, dtype, device):
        k_multiple, n_multiple = self.multiples(backend_cls)
        group = group_size(backend_cls(dict(options)).quant_scheme(), k_multiple)
        unit = math.lcm(k_multiple, n_multiple)
        by_shape: dict[tuple, list[tuple[BoundaryCase, str]]] = {}
        for index, case in enumerate(boundary_cases(self.m_thresholds)):
            by_shape.setdefault((case.num_groups, case.tp_size), []).append((case, boundary_layer(case, index)))
        with one_thread():
            for seed, ((num_groups, tp), cases) in enumerate(by_shape.items()):
                self._check_shape(backend_cls, options, dtype, device, cases,
                                  boundary_shape(num_groups, tp, group, unit), seed, group)

    def _check_shape(self, backend_cls, options, dtype, device, cases, shape, seed, group):
        g = generator(seed)
        weights = {n: t.to(dtype) for n, t in checkpoint_weights(shape, g).items()}
        tensors, options, scheme = self._checkpoint(backend_cls, options, weights, None)
        names = {name for _, name in cases}
        steps = {n: weight_step(t, scheme) for n, t in weights.items()
                 if n.endswith("proj.weight") and split_name(n)[0] in names}
        in_features = {"qkv_proj": shape.hidden, "gate_up_proj": shape.hidden, "o_proj": shape.num_heads * shape.head_dim}
        inputs = [random_activations(*case.leading(), in_features[name], g=g) for case, name in cases]
        tp = cases[0][0].tp_size
        for rank in range(tp):
            layers = build_layers(lambda: backend_cls(dict(options)), shape, rank, tp, dtype, device)
            load_checkpoint(layers, tensors, device, self.backend)
            oracles = build_layers(UnquantizedLinearMethod, shape, rank, tp, dtype, device)
            load_checkpoint(oracles, weights, device, "unquantized")
            step_layers = build_layers(UnquantizedLinearMethod, replace(shape, qkv_bias=False), rank, tp,
                                       torch.float64, "cpu")
            load_checkpoint({n: step_layers[n] for n in names}, steps, "cpu", "steps")
            for (case, name), x in zip(cases, inputs):
                x = x.chunk(tp, dim=-1)[rank] if name in ROW_PARALLEL else x
                where = f"{case.label(shape.hidden, group)}: {name} (tp rank {rank} of {tp}, {shape})"
                # elementwise bounds only: over hundreds of rows, the gain regression would see round-to-nearest's
                # slight pull toward zero (fp8: densities fall within a binade) as a scale error
                self._compare(layers[name], oracles[name], step_layers[name].weight, x.to(dtype=dtype, device=device),
                              scheme, where, check_gain=False)
