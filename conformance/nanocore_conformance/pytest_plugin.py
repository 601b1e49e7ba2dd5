"""pytest11 plugin: the ``cuda`` and ``timing`` markers, and skipping CUDA tests (with the reason) where there is no GPU."""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU (skipped without one)")
    config.addinivalue_line("markers", "timing: measures speed; asserts a generous bound and reports the figure")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is None:
        return
    import torch  # only here: the plugin loads in every pytest run of the environment

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: no NVIDIA GPU is visible to torch here (torch.cuda.is_available() is False)")
