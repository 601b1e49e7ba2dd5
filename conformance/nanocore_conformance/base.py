"""What every conformance class shares: the backend resolved by name, fixtures, tolerance checks."""
from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import HealthCheck, settings

from nanocore.plugins import BackendEntry, BackendError, get_registry

MAX_EXAMPLES = int(os.environ.get("NANOCORE_CONFORMANCE_EXAMPLES", "25"))

# The fixtures only hold configuration, so sharing them across hypothesis examples is safe.
suite_settings = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    # differing_executors: one base method runs for many subclasses, by design
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.differing_executors],
)


def resolve_entry(kind: str, backend: str) -> BackendEntry:
    """The registry entry of ``backend`` (a name or ``distribution:name``), or a test failure saying why."""
    if not backend:
        pytest.fail(f"set the class attribute `backend = \"NAME\"` to the {kind} you want to test", pytrace=False)
    registry = get_registry()
    try:
        return registry.get(kind, backend)
    except BackendError as exc:
        failed = "; ".join(f"{f.plugin} ({f.distribution}): {f.error}" for f in registry.failures)
        pytest.fail(f"{exc}" + (f" Failed plugins: {failed}" if failed else ""), pytrace=False)


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(*shape: int, seed_gen: torch.Generator, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Random normal data (never zeros: zeros hide layout and scale bugs)."""
    return (torch.randn(*shape, generator=seed_gen) * scale).to(dtype=dtype, device=device)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: tuple[float, float], what: str,
                 atol_scale: float = 1.0) -> None:
    """``|actual - expected| <= atol * atol_scale + rtol * |expected|`` elementwise, with a readable failure."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    atol, rtol = tolerance
    atol = atol * atol_scale
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    err = (actual - expected).abs()
    bad = ~(err <= atol + rtol * expected.abs())  # NaN counts as bad
    if bad.any():
        worst = int(torch.nan_to_num(err, nan=float("inf")).flatten().argmax())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements outside tolerance (atol={atol:.3g}, "
            f"rtol={rtol:.3g}); worst at flat index {worst}: got {actual.flatten()[worst].item():.6g}, "
            f"expected {expected.flatten()[worst].item():.6g}. If this error is inherent to the format, "
            f"declare a looser `tolerance` on the backend class."
        )


def check_tolerance_declaration(cls: type) -> None:
    tolerance = getattr(cls, "tolerance", None)
    ok = isinstance(tolerance, tuple) and len(tolerance) == 2 and all(
        isinstance(t, (int, float)) and t >= 0 for t in tolerance)
    assert ok, f"{cls.__name__}.tolerance must be a tuple (atol, rtol) of two non-negative numbers, got {tolerance!r}"


class BackendConformance:
    """Resolves ``backend`` of ``kind`` through the registry; subclasses add the checks."""

    #: Extension point, spelled as in the config ("linear_method", ...). Set by the per-kind classes.
    kind: ClassVar[str] = ""
    #: The backend under test: a registered name or ``"distribution:name"``. Set by your test class.
    backend: ClassVar[str] = ""
    #: Class attributes a backend may also set through its ``conformance_requirements`` dict (per kind).
    requirement_names: ClassVar[tuple[str, ...]] = ()

    @pytest.fixture(autouse=True)
    def declared_requirements(self, backend_cls) -> dict[str, Any]:
        """The backend's ``conformance_requirements`` applied to this test (they win over the class's own), so a
        generated or scaffolded class tests what the backend declares."""
        declared = getattr(backend_cls, "conformance_requirements", None) or {}
        if not self.requirement_names:
            return declared  # a contract-only class reads none of them
        if not isinstance(declared, dict):
            pytest.fail(f"{backend_cls.__name__}.conformance_requirements must be a dict, got {declared!r}",
                        pytrace=False)
        unknown = sorted(set(declared) - set(self.requirement_names))
        if unknown:
            pytest.fail(f"{backend_cls.__name__}.conformance_requirements has {unknown}, which a {self.kind} cannot "
                        f"declare; it may declare {list(self.requirement_names) or 'nothing'}", pytrace=False)
        for name, value in declared.items():
            setattr(self, name, value)
        return declared

    @pytest.fixture
    def backend_entry(self) -> BackendEntry:
        return resolve_entry(self.kind, self.backend)

    @pytest.fixture
    def backend_cls(self, backend_entry: BackendEntry) -> type:
        return backend_entry.cls

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        """Options passed to the backend's constructor; override to test a configuration."""
        return {}

    @pytest.fixture
    def device(self, backend_cls) -> torch.device:
        """CPU if the backend supports it, else CUDA if it is here and supported; skipped otherwise."""
        reasons = []
        candidates = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
        for candidate in candidates:
            reason = backend_cls.supports(candidate)
            if reason is None:
                return candidate
            reasons.append(f"{candidate}: {reason}")
        if not torch.cuda.is_available():
            reasons.append("cuda: no CUDA device here")
        pytest.skip(f"{self.kind} {self.backend!r} runs on no device here ({'; '.join(reasons)})")

    @pytest.fixture
    def dtype(self) -> torch.dtype:
        return torch.float32

    @pytest.fixture
    def cuda_device(self, backend_cls) -> torch.device:
        """CUDA for the ``@pytest.mark.cuda`` checks (the marker skips them without a GPU)."""
        device = torch.device("cuda")
        reason = backend_cls.supports(device)
        if reason:
            pytest.skip(f"{self.kind} {self.backend!r} does not run on this GPU: {reason}")
        return device

    @pytest.fixture
    def cuda_dtype(self) -> torch.dtype:
        return torch.bfloat16
