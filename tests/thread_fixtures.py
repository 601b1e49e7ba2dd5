"""One torch thread per process for tests that run several engines or ranks on a 2-core machine.

Import the fixture into a test module (``from thread_fixtures import one_thread``): it is autouse there.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One torch thread here and in the workers this test spawns (they inherit the variable); no test may leave a
    process group behind."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    assert not dist.is_initialized(), "an LLM left its process group behind"
