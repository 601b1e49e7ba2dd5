"""The mutation tool counts kills and survivors correctly, on a tiny fake target with a tiny test."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

MUTATE = Path(__file__).resolve().parents[1] / "mutation" / "mutate.py"

CALC = '''\
def double(x: int | float) -> int | float:
    return x + x


def untargeted(x):
    return x - 1
'''

CHECK = '''\
from fakecalc.calc import double


def test_double():
    assert double(2) == 4
'''

TARGETS = '''\
[operators]
exclude = ['ReplaceBinaryOperator_\\w+_(Pow|RShift|LShift|BitOr|BitAnd|BitXor|Mod)$']

[[target]]
name = "fake/calc"
kind = "fake"
file = "fakecalc/calc.py"
functions = ["double"]
tests = ["check_calc.py"]
'''

SURVIVOR = "ReplaceBinaryOperator_Add_Mul@1:13#1"  # 2 * 2 == 2 + 2: the test cannot tell


def _mutate(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(MUTATE), *args, "--repo", str(tmp_path / "repo"), "--targets",
         str(tmp_path / "repo" / "targets.toml"), "--results", str(tmp_path / "results.json"),
         "--triage", str(tmp_path / "triage.toml"), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow  # five pytest runs in subprocesses (one per mutant, one baseline)
def test_counts_kills_and_survivors_and_reruns_only_changed_functions(tmp_path):
    repo = tmp_path / "repo"
    (repo / "fakecalc").mkdir(parents=True)
    (repo / "fakecalc" / "calc.py").write_text(CALC)
    (repo / "check_calc.py").write_text(CHECK)
    (repo / "targets.toml").write_text(TARGETS)

    out = _mutate(tmp_path, "run")
    assert "4 mutants to run" in out, out  # + -> -, *, /, //; not the annotations' |, not `untargeted`
    stored = json.loads((tmp_path / "results.json").read_text())["targets"]["fake/calc"]["functions"]
    assert list(stored) == ["double"]
    outcomes = {m["id"]: m["outcome"] for m in stored["double"]["mutants"]}
    assert outcomes == {"ReplaceBinaryOperator_Add_Sub@1:13#1": "killed", SURVIVOR: "survived",
                        "ReplaceBinaryOperator_Add_Div@1:13#1": "killed",
                        "ReplaceBinaryOperator_Add_FloorDiv@1:13#1": "killed"}
    assert "| fake | fake/calc | 4 | 3 | 1 | 0 | 75.0% |" in out
    assert f"`{SURVIVOR}`: `return x + x` -> `return x * x`" in (tmp_path / "results.md").read_text()

    (tmp_path / "triage.toml").write_text(
        f'[[equivalent]]\ntarget = "fake/calc"\nfunction = "double"\nmutant = "{SURVIVOR}"\nreason = "for the test"\n')
    (repo / "fakecalc" / "calc.py").write_text(CALC.replace("x - 1", "x - 2"))  # outside the target function
    out = _mutate(tmp_path, "run")
    assert "1 of 1 functions unchanged since their stored run, 0 mutants to run" in out, out
    assert "| fake | fake/calc | 4 | 3 | 1 | 1 | 100.0% |" in out

    (repo / "fakecalc" / "calc.py").write_text(CALC.replace("return x + x", "return x"))  # nothing left to mutate
    _mutate(tmp_path, "run")
    stored = json.loads((tmp_path / "results.json").read_text())["targets"]["fake/calc"]["functions"]
    assert [f["mutants"] for f in stored.values()] == [[]], f"outcomes of the old source of double stayed: {stored}"
