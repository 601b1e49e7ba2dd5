"""The suite proves itself: every planted wrong backend is rejected, every correct one passes.

``mutants/`` holds one module per kind defining ``CORRECT`` and ``MUTANTS`` (backend classes; each mutant's
docstring says the bug a real author could plant) and binding every class to the conformance class of its kind
with ``nanocore_conformance.bind_all`` (``Test<Name>``). Here each bound class runs in a nested pytest (fixed
hypothesis exploration, no shrinking, CPU checks): a correct backend must pass every check, a mutant fail one.
"""
from __future__ import annotations

import importlib.util
import pkgutil
from pathlib import Path

import pytest
from hypothesis import Phase, settings

MUTANTS_DIR = Path(__file__).with_name("mutants")
# shrinking the planted failures would only cost time; a fixed exploration keeps CI deterministic
settings.register_profile("mutants", phases=[Phase.explicit, Phase.generate], database=None, derandomize=True,
                           report_multiple_bugs=False)


def _cases(list_name: str) -> list:
    cases = []
    for info in pkgutil.iter_modules([str(MUTANTS_DIR)]):
        module = _load(info.name)
        for cls in getattr(module, list_name, []):
            cases.append(pytest.param(info.name, cls.__name__, id=f"{info.name}-{cls.__name__}"))
    return cases


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"nanocore_mutants_{name}", MUTANTS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Outcomes:
    """Collects (test id, outcome) of a nested pytest run; a failed fixture or collection counts as failed.

    Also gives every hypothesis test of the run the fixed, shrink-free exploration: the conformance classes'
    settings objects were made at import time, before any profile loads, so the profile alone does not reach them
    (restored by ``restore`` after the run: the same functions serve the outer test session)."""

    def __init__(self):
        self.reports: dict[str, str] = {}
        self.errors: list[str] = []
        self.saved: list[tuple[object, object]] = []

    def pytest_collection_modifyitems(self, items):
        for item in items:
            func = getattr(getattr(item, "obj", None), "__func__", None)
            old = getattr(func, "_hypothesis_internal_use_settings", None)
            if old is None or any(f is func for f, _ in self.saved):
                continue
            self.saved.append((func, old))
            func._hypothesis_internal_use_settings = settings(
                old, phases=[Phase.explicit, Phase.generate], derandomize=True, database=None,
                report_multiple_bugs=False)

    def restore(self):
        for func, old in self.saved:
            func._hypothesis_internal_use_settings = old

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.reports[report.nodeid.split("::")[-1]] = report.outcome

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(str(report.longrepr))


def run_bound_class(module_name: str, class_name: str) -> Outcomes:
    outcomes = Outcomes()
    node = f"{MUTANTS_DIR / (module_name + '.py')}::Test{class_name}"
    profile = settings.get_current_profile_name()
    try:
        # the seed makes every @given deterministic, also those whose settings objects were made at import time
        # (before the profile loads); the profile covers the rest
        pytest.main([node, "-q", "-p", "no:cacheprovider", "--no-header", "--hypothesis-seed=0",
                     "--hypothesis-profile=mutants", "-m", "not cuda"], plugins=[outcomes])
    finally:
        outcomes.restore()
        settings.load_profile(profile)
    assert not outcomes.errors, f"{class_name}: the bound class did not collect: {outcomes.errors}"
    assert outcomes.reports, f"{class_name}: no check ran"
    return outcomes


@pytest.mark.parametrize("module_name, class_name", _cases("CORRECT"))
def test_correct_backend_passes(module_name, class_name):
    outcomes = run_bound_class(module_name, class_name)
    failed = {k: v for k, v in outcomes.reports.items() if v == "failed"}
    assert not failed, f"correct backend {class_name} failed: {sorted(failed)}"


@pytest.mark.parametrize("module_name, class_name", _cases("MUTANTS"))
def test_wrong_backend_is_rejected(module_name, class_name):
    outcomes = run_bound_class(module_name, class_name)
    failed = sorted(k for k, v in outcomes.reports.items() if v == "failed")
    assert failed, f"the suite passed the wrong backend {class_name} (checks run: {sorted(outcomes.reports)})"
