"""``nanocore plugin new``: the generated distributions install and pass their conformance tests as written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nanocore.cli.main import main
from nanocore.interfaces import KINDS
from nanocore.scaffold import write_plugin


def run(*cmd, env=None, cwd=None, timeout=600):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert result.returncode == 0, f"{cmd} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def installed_plugins(tmp_path_factory):
    """One generated plugin per kind, pip-installed into a target folder (the shared venv stays clean)."""
    base = tmp_path_factory.mktemp("scaffold")
    roots = [write_plugin(f"scaffolded_{kind}", kind, base / "src" / kind) for kind in KINDS]
    target = base / "site"
    run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
        "--target", str(target), *map(str, roots))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    env.pop("NANOCORE_PLUGINS", None)
    env.pop("NANOCORE_DISABLE_PLUGINS", None)
    return roots, env


def test_generated_layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = write_plugin("my_codec", "kv_codec")  # default folder: ./nanocore-my-codec
    assert root.resolve() == tmp_path / "nanocore-my-codec"
    pyproject = (root / "pyproject.toml").read_text()
    assert '[project.entry-points.nanocore]\nmy_codec = "nanocore_my_codec.plugin"' in pyproject
    assert "@hookimpl\ndef nanocore_kv_codecs():" in (root / "nanocore_my_codec" / "plugin.py").read_text()
    backend = (root / "nanocore_my_codec" / "backend.py").read_text()
    assert "STUB" in backend and "class MyCodecKVCodec(KVCodec):" in backend
    test = (root / "tests" / "test_conformance.py").read_text()
    assert "class TestMyCodecKVCodec(KVCodecConformance):" in test and 'backend = "my_codec"' in test
    readme = (root / "README.md").read_text()
    assert "## What to fill in" in readme and "nanocore.interfaces.kv_codec" in readme
    assert 'dependencies = ["nanocore-llm>=' in pyproject  # the API major it targets, checked by the registry
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


def test_templates_carry_only_what_their_kind_needs(tmp_path):
    for kind in KINDS:
        root = write_plugin(f"only_{kind}", kind, tmp_path / kind)
        # the Triton-interpreter conftest serves the KV layout checks (the core's paged attention) alone
        assert (root / "tests" / "conftest.py").exists() == (kind == "kv_codec"), kind
        assert "conformance_requirements" in (root / "tests" / "test_conformance.py").read_text()


def test_generated_plugins_are_listed_once_installed(installed_plugins):
    _, env = installed_plugins
    out = run(sys.executable, "-m", "nanocore.cli.main", "plugins", "--json", env=env).stdout
    rows = {(r["kind"], r["name"]): r for r in json.loads(out)}
    for kind in KINDS:
        row = rows[(kind, f"scaffolded_{kind}")]
        assert row["distribution"] == f"nanocore-scaffolded-{kind.replace('_', '-')}" and row["supported"] is True


def test_generated_conformance_tests_pass_out_of_the_box(installed_plugins):
    roots, env = installed_plugins
    tests = [str(root / "tests") for root in roots]
    result = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                 *tests, env=env, cwd=roots[0].parent)
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_nanocore_conformance_runs_a_generated_plugin(installed_plugins):
    _, env = installed_plugins
    result = run(sys.executable, "-m", "nanocore.cli.main", "conformance", "--name", "scaffolded_moe_executor",
                 env=env)
    assert " passed" in result.stdout


@pytest.mark.parametrize("name, kind, message", [
    ("My-Plugin", "linear_method", "lower case letters"),
    ("unquantized", "linear_method", "already registered by nanocore"),
])
def test_bad_names_are_refused(tmp_path, capsys, name, kind, message):
    assert main(["plugin", "new", name, "--kind", kind, "--dir", str(tmp_path)]) == 1
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_existing_folder_is_not_overwritten(tmp_path):
    write_plugin("twice", "scheduler_policy", tmp_path)
    with pytest.raises(ValueError, match="already exists"):
        write_plugin("twice", "scheduler_policy", tmp_path)


def test_dir_is_the_distribution_folder(tmp_path, capsys):
    """The README's two lines: `plugin new ... --dir D` then `pip install -e D` (D holds pyproject.toml)."""
    target = tmp_path / "nanocore-my-codec"
    assert main(["plugin", "new", "my_codec", "--kind", "kv_codec", "--dir", str(target)]) == 0
    assert (target / "pyproject.toml").is_file() and (target / "nanocore_my_codec" / "backend.py").is_file()
    assert f"pip install -e '{target}[test]'" in capsys.readouterr().out
    assert main(["plugin", "new", "my_codec", "--kind", "kv_codec", "--dir", str(target)]) == 1  # not empty


def test_generated_backends_use_only_the_public_surface(tmp_path):
    from nanocore_conformance.surface import imports_outside_surface
    for kind in KINDS:
        root = write_plugin(f"pub_{kind}", kind, tmp_path / kind)
        assert imports_outside_surface(root) == []
