"""An outside author's install before a release exists: wheels of the core, the conformance suite and one plugin,
built from this checkout into a local wheelhouse, installed into a fresh virtual environment, found by name."""
from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {"nanocore-llm": ROOT, "nanocore-conformance": ROOT / "conformance",
                 "nanocore-radix": ROOT / "plugins_cache" / "radix"}

PROBE = """
import json, nanocore, nanocore_conformance, nanocore_radix
from nanocore.plugins import get_registry
entry = get_registry().get("prefix_cache", "radix")
print(json.dumps({"files": [m.__file__ for m in (nanocore, nanocore_conformance, nanocore_radix)],
                  "distribution": entry.distribution, "refused": get_registry().refused["prefix_cache"]}))
"""


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args[:4]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def _source_copy(tmp_path: Path) -> list[Path]:
    """Each distribution's sources copied out of the checkout (setuptools writes build/ beside what it builds)."""
    skip = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests", "mutation")
    core = tmp_path / "src" / "core"
    shutil.copytree(ROOT / "nanocore", core / "nanocore", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, core / name)
    copies = [core]
    for name, folder in list(DISTRIBUTIONS.items())[1:]:
        copies.append(tmp_path / "src" / name)
        shutil.copytree(folder, copies[-1], ignore=skip)
    return copies


def test_core_conformance_and_a_plugin_install_from_a_local_wheelhouse(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    # --no-build-isolation: the build backend (setuptools) comes from this environment, so no index is needed
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheelhouse,
          *_source_copy(tmp_path)])
    built = sorted(p.name.split("-")[0] for p in wheelhouse.glob("*.whl"))
    assert built == sorted(name.replace("-", "_") for name in DISTRIBUTIONS)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site_packages = next(env_dir.glob("lib/python*/site-packages"))
    # torch, pip and the other third-party requirements come from this environment, after the venv's own
    # site-packages; a path listed in a .pth file does not run that directory's editable-install hooks
    (site_packages / "zz_test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheelhouse, "--ignore-installed",
          "--no-deps", *DISTRIBUTIONS])
    probe = json.loads(_run([python, "-c", PROBE], cwd=tmp_path).stdout.strip().splitlines()[-1])
    env_lib = str(env_dir / "lib")
    assert all(path.startswith(env_lib) for path in probe["files"]), probe["files"]  # the wheels, not this checkout
    assert probe["distribution"] == "nanocore-radix" and not probe["refused"]  # its nanocore-llm pin is accepted
    installed = _run([python, "-m", "pip", "list", "--format", "json", "--path", site_packages]).stdout
    assert {"nanocore-llm", "nanocore-conformance", "nanocore-radix"} <= {d["name"] for d in json.loads(installed)}
