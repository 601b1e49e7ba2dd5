"""``nanocore plugins`` and ``nanocore conformance`` in a subprocess, with fake plugin distributions installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DISTS = Path(__file__).parent / "fixtures" / "dists"
KEYS = ["kind", "name", "distribution", "version", "supported", "reason"]
BUILTINS = {("linear_method", "unquantized"), ("kv_codec", "unquantized"), ("prefix_cache", "none"),
            ("moe_executor", "eager"), ("scheduler_policy", "prefill_first")}


def nanocore(*args: str, roots: tuple[str, ...] = ("good", "broken", "duplicate")) -> subprocess.CompletedProcess:
    path = [str(DISTS / root) for root in roots] + [os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop("NANOCORE_PLUGINS", None)
    env.pop("NANOCORE_DISABLE_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "nanocore.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_plugins_json_lists_builtins_broken_and_duplicate():
    result = nanocore("plugins", "--json", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert all(list(row) == KEYS for row in rows)
    by_key = {(r["kind"], r["name"]): r for r in rows if r["distribution"] == "nanocore"}
    assert BUILTINS <= set(by_key) and all(by_key[k]["supported"] and by_key[k]["reason"] is None for k in BUILTINS)
    [broken] = [r for r in rows if r["kind"] == "failed_plugin"]
    assert broken["name"] == "fake_broken" and broken["distribution"] == "nanocore-fake-broken"
    assert broken["supported"] is False and "libfakeaccel.so" in broken["reason"]
    duplicates = [r for r in rows if r["name"] == "fake_linear"]
    assert {r["distribution"] for r in duplicates} == {"nanocore-fake-good", "nanocore-fake-dup"}
    assert all(not r["supported"] and "several distributions" in r["reason"] for r in duplicates)
    [accel] = [r for r in rows if r["name"] == "accel_codec"]
    assert accel["supported"] is False and "fake accelerator" in accel["reason"]


def test_plugins_table_shows_backends_and_failures():
    result = nanocore("plugins", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == ["kind", "name", "distribution", "version", "supported"]
    assert any(line.split() == ["scheduler_policy", "prefill_first", "nanocore", line.split()[3], "yes"]
               for line in lines if line.startswith("scheduler_policy"))
    assert "failed plugins" in result.stdout and "fake_broken (nanocore-fake-broken 0.2)" in result.stdout
    assert "no: needs the fake accelerator" in result.stdout


def test_conformance_passes_for_a_builtin_and_fails_for_a_duplicate_name():
    ok = nanocore("conformance", "--kind", "scheduler_policy", "--name", "prefill_first")
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert " passed" in ok.stdout
    # the duplicated name fails its uniqueness check, for each distribution
    bad = nanocore("conformance", "--kind", "linear_method", "--name", "fake_linear", "--", "-k", "unique")
    assert bad.returncode == 1, bad.stdout[-3000:]
    assert "2 failed" in bad.stdout and "registered by several distributions" in bad.stdout


def test_conformance_reports_failed_plugins():
    result = nanocore("conformance", "--name", "fake_broken")
    assert result.returncode == 1
    assert "libfakeaccel.so" in result.stdout


def test_conformance_with_no_matching_backend_is_a_clear_error():
    result = nanocore("conformance", "--kind", "kv_codec", "--name", "no_such_codec", roots=())
    assert result.returncode == 1 and "no installed backend matches" in result.stderr
