"""The suite itself: each planted bug is caught (prefix-cache and scheduler ones live in mutants/)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, settings

# shrinking the planted failures would only cost time
settings.register_profile("planted_bugs", phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)


class Outcomes:
    """Collects (nodeid, outcome) of a nested pytest run."""

    def __init__(self):
        self.reports = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.reports[report.nodeid] = report.outcome


@pytest.mark.parametrize("class_name, check", [
    ("TestWritesSlotMinusOne", "test_slot_minus_one_leaves_cache_untouched"),
])
def test_backend_bugs_are_caught(class_name, check):
    outcomes = Outcomes()
    node = f"{Path(__file__).with_name('planted_backends.py')}::{class_name}::{check}"
    profile = settings.get_current_profile_name()
    try:
        pytest.main([node, "-q", "-p", "no:cacheprovider", "--no-header",
                     "--hypothesis-profile=planted_bugs"], plugins=[outcomes])
    finally:
        settings.load_profile(profile)
    assert list(outcomes.reports.values()) == ["failed"], outcomes.reports
