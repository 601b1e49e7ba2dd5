"""The scheduler driver's liveness check counts steps without a new token, not steps in all: with a one-token budget
and a KV cache that holds only the largest request, thrashing (one sequence's decode preempts the other, which
recomputes from position 0 at one token per step) is legal and slow, and must not read as a livelock."""
from __future__ import annotations

from nanocore_conformance.scheduler_driver import SchedulerDriver

from nanocore.builtin.prefill_first import PrefillFirstPolicy


def test_thrashing_under_a_one_token_budget_finishes():
    # found by hypothesis in CI: 117 steps, more than the old absolute bound (114), with progress all along
    driver = SchedulerDriver(PrefillFirstPolicy({"chunk_size": 3}), 1, 1, 1, 18)
    result = driver.run([(0, 1, 9), (0, 17, 1)], frozenset())
    assert result.num_preemptions > 0 and result.steps > 114

