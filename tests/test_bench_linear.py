"""`nanocore bench linear` on CPU at tiny shapes: every installed method, errors checked, JSON with provenance."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from test_cli_engine import run_cli  # noqa: E402

from nanocore.bench.linear import BASELINE, bench_shape, summarise  # noqa: E402
from nanocore.plugins import BackendEntry, get_registry  # noqa: E402
from nanocore.toolkit.reference import UnquantizedLinearMethod  # noqa: E402


def test_cli_on_cpu_covers_every_installed_method(tmp_path):
    out = tmp_path / "linear.json"
    result = run_cli("bench", "linear", "--device", "cpu", "--shapes", "tiny", "--ms", "1,3", "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    registry = get_registry()
    expected = {n for n in registry.names("linear_method")
                if registry.get("linear_method", n).cls.supports(torch.device("cpu")) is None}
    assert {r["method"] for r in data["summary"]} == expected
    assert {"torch", "git_commit", "device"} <= set(data["environment"])
    for row in data["summary"]:
        assert "error" not in row, row
        assert row["layer_ms"] > 0 and row["m"] in (1, 3)
        bound = error_bound(registry.get("linear_method", row["method"]).cls)
        assert row["max_err_vs_fp32"] <= bound, row  # per-element error vs max|y|
        if row["method"] == BASELINE:
            assert row["speedup"] == 1.0 and row["max_err_vs_fp32"] < 1e-5
    assert BASELINE in result.stdout and "speedup" in result.stdout


def error_bound(cls) -> float:
    """A few rounding steps of the declared weight format, relative to max|y| (1e-5: not quantized)."""
    scheme = cls({}).quant_scheme()
    if scheme is None or scheme.weights is None:
        return 4e-5
    mantissa_bits = 3 if scheme.weights.type == "float" else scheme.weights.num_bits - 1  # e4m3: 3
    return 4 * 2.0 ** -mantissa_bits


class _BrokenMethod(UnquantizedLinearMethod):
    """A third-party method whose apply is wrong by a factor of two."""

    def apply(self, layer, x, bias=None):
        return 2 * super().apply(layer, x, bias)


class _UnbuildableMethod(UnquantizedLinearMethod):
    def create_weights(self, *args, **kwargs):
        raise RuntimeError("cannot build")


def test_wrong_and_failing_methods_are_reported_not_fatal():
    classes = {BASELINE: UnquantizedLinearMethod, "broken": _BrokenMethod, "unbuildable": _UnbuildableMethod}
    methods = {name: BackendEntry("linear_method", name, cls, "tests", "0", "tests") for name, cls in classes.items()}
    rows = bench_shape(methods, "o_proj", 24, 32, [2], torch.float32, torch.device("cpu"))
    summary = {r["method"]: r for r in summarise(rows, list(methods), [2])}
    assert abs(summary["broken"]["max_err_vs_fp32"] - 1.0) < 1e-4  # 2y - y relative to max|y|
    assert "cannot build" in summary["unbuildable"]["error"]
    assert summary[BASELINE]["max_err_vs_fp32"] < 1e-5
