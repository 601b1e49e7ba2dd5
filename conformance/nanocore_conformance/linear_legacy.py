"""Linear methods written for plugin API 1.0 that declare only ``tolerance`` (no ``quant_scheme()``).

1.0 compared ``apply`` with ``unquantized`` as ``|got - oracle| <= atol * max(|x| |W|^T) + rtol * |oracle|``: atol
relative to the GEMM's scale. Such a method is held to that rule (no systematic-gain check: 1.0 had none) and warned
to declare its scheme, from which the suite derives the rounding noise the format allows.
"""
from __future__ import annotations

import functools

import torch

from nanocore.interfaces import LinearMethod
from nanocore_conformance.compat import warn_legacy


@functools.cache  # one warning per class
def legacy_tolerance(cls: type) -> tuple[float, float] | None:
    """The 1.0 ``tolerance`` a method relies on: it overrides ``tolerance`` but not ``quant_scheme``; else None."""
    if getattr(cls, "quant_scheme", None) is not LinearMethod.quant_scheme:
        return None
    tolerance = getattr(cls, "tolerance", LinearMethod.tolerance)
    if tolerance == LinearMethod.tolerance:
        return None
    warn_legacy(cls, f"declares tolerance = {tolerance} but no quant_scheme(), so it is tested by plugin API 1.0's "
                     f"rule (atol relative to max |x| |W|^T); add `def quant_scheme(self): return QuantScheme(...)` "
                     f"(nanocore.interfaces) stating how it rounds weights and activations, and the suite derives "
                     f"the tolerance from the format")
    return tuple(tolerance)


def legacy_allowed(x2: torch.Tensor, weight: torch.Tensor, want: torch.Tensor,
                   tolerance: tuple[float, float]) -> torch.Tensor:
    """1.0's allowed |error| per output of ``x2 [M, K] @ weight [N, K]^T``, ``want`` the oracle's output."""
    atol, rtol = tolerance
    gemm_scale = float((x2.abs().float() @ weight.abs().float().t()).max()) if x2.numel() else 0.0
    return atol * gemm_scale + rtol * want.abs()
