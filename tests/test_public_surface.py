"""The public plugin surface holds: import-linter's contracts (pyproject.toml) and an AST scan of every plugin."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nanocore_conformance.surface import PUBLIC_SURFACE, imports_outside_surface, nanocore_imports

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_PACKAGES = sorted(p for p in ROOT.glob("plugins*/*/nanocore_*") if p.is_dir() and not p.name.endswith("egg-info"))


def test_import_linter_contracts_are_kept():
    result = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                             "lint_imports_command()"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"lint-imports found a broken contract:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("package", PLUGIN_PACKAGES, ids=lambda p: p.name)
def test_plugin_imports_only_the_public_surface(package):
    """Also catches a new internal module that the import-linter list does not name yet."""
    assert PLUGIN_PACKAGES, "no plugin packages found"
    bad = imports_outside_surface(package)
    assert not bad, ("plugins may import only " + ", ".join(PUBLIC_SURFACE) + " from nanocore (docs/internals.md, "
                     "'The public plugin surface'); move what you need into nanocore.toolkit:\n" + "\n".join(bad))


def test_the_scan_catches_an_internal_import(tmp_path):
    path = tmp_path / "plugin.py"
    path.write_text("def f():\n    from nanocore.engine.scheduler import Scheduler\nimport nanocore.toolkit.kv\n")
    assert sorted(nanocore_imports(path)) == [(2, "nanocore.engine.scheduler"), (3, "nanocore.toolkit.kv")]
