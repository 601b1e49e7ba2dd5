"""benchmarks.step_profile: the timeline split on known intervals, and a CPU run of the phase table."""
from __future__ import annotations

import pytest

from benchmarks.step_profile import device_timeline, main


def test_device_timeline_splits_busy_and_idle_time():
    # two steps: overlapping kernels (0..10, 5..12), a 3 us gap, a kernel inside another, then a 20 us gap
    intervals = [(15.0, 30.0), (0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (50.0, 54.0)]
    row = device_timeline(intervals, steps=2, gap_us=5.0)
    assert row["span_us_per_step"] == pytest.approx(54.0 / 2)
    assert row["busy_us_per_step"] == pytest.approx((12.0 + 15.0 + 4.0) / 2)
    assert row["idle_us_per_step"] == pytest.approx((3.0 + 20.0) / 2)
    assert row["largest_gap_us"] == pytest.approx(20.0)
    assert row["gaps_over_5us_per_step"] == pytest.approx(0.5)


def test_device_timeline_of_back_to_back_kernels_has_no_idle_time():
    row = device_timeline([(0.0, 4.0), (4.0, 9.0), (9.0, 10.0)], steps=1)
    assert row["busy_us_per_step"] == pytest.approx(10.0)
    assert row["idle_us_per_step"] == 0.0 and row["largest_gap_us"] == 0.0
    assert device_timeline([], steps=3) == {}


def test_step_profile_runs_on_cpu_and_refuses_a_cpu_timeline(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["--model", "dummy:tiny-qwen2", "--device", "cpu", "--dtype", "float32", "--batch-sizes", "1", "2",
                 "--context-len", "16", "--steps", "2", "--max-model-len", "64", "--json", str(out)]) == 0
    assert "wall_async_ms" in capsys.readouterr().out and out.exists()
    with pytest.raises(SystemExit):
        main(["--model", "dummy:tiny-qwen2", "--device", "cpu", "--timeline"])
    assert "needs --device cuda" in capsys.readouterr().err
