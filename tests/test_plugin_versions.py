"""A plugin's compatibility comes from what it declares: its own api_version, its distribution's requirement."""
from __future__ import annotations

import pytest

from nanocore import __version__
from nanocore.interfaces import API_VERSION, KVCodec
from nanocore.plugin_versions import compatibility_problem, declared_api_version
from nanocore.toolkit.reference import UnquantizedKVCodec

MAJOR = int(API_VERSION.split(".")[0])


class Silent(UnquantizedKVCodec):
    """Declares nothing: inherits the core's api_version through the reference backend."""


class Explicit(UnquantizedKVCodec):
    api_version = f"{MAJOR}.0"


class NextMajor(UnquantizedKVCodec):
    api_version = f"{MAJOR + 1}.0"


class NewerMinor(UnquantizedKVCodec):
    api_version = f"{MAJOR}.99"


class ChildOfExplicit(Explicit):
    """Inherits a declaration from the plugin's own base class: that counts."""


def problem(cls, requires):
    return compatibility_problem("kv_codec", "x", cls, "p", "dist-x", requires)


def test_inherited_interface_version_is_not_a_declaration():
    assert KVCodec.api_version == API_VERSION
    assert declared_api_version(Silent) is None
    assert declared_api_version(Explicit) == f"{MAJOR}.0"
    assert declared_api_version(ChildOfExplicit) == f"{MAJOR}.0"


def test_explicit_same_major_loads_quietly(recwarn):
    assert problem(Explicit, []) is None and not recwarn.list


@pytest.mark.parametrize("cls, words", [(NextMajor, "written for nanocore's plugin API"), (NewerMinor, "upgrade nanocore")])
def test_incompatible_api_version_is_refused_with_what_to_do(cls, words):
    message = problem(cls, [])
    assert message and words in message and "dist-x" in message


@pytest.mark.parametrize("core", ["nanocore-llm", "nanocore", "Nanocore_LLM"])  # the name, the pre-rename name
def test_distribution_requirement_decides_for_a_silent_class(recwarn, core):
    assert problem(Silent, [f"{core}>={API_VERSION},<{MAJOR + 1}"]) is None and not recwarn.list
    message = problem(Silent, [f"{core}<{MAJOR}"])
    assert message and f"requires {core}<{MAJOR}" in message and __version__ in message
    # an explicit class is refused too when its distribution excludes this nanocore
    assert problem(Explicit, [f"{core}>={MAJOR + 1}"])


def test_a_requirement_on_another_distribution_is_not_the_core(recwarn):
    with pytest.warns(DeprecationWarning, match="declares no api_version"):
        assert problem(Silent, ["nanocore-llm-extras<1", "nanocorex<1"]) is None


def test_declaring_nothing_warns_and_loads():
    with pytest.warns(DeprecationWarning, match="declares no api_version"):
        assert problem(Silent, ["nanocore", "torch>=2"]) is None
    with pytest.warns(DeprecationWarning, match=f'api_version = "{API_VERSION}"'):
        assert problem(Silent, []) is None


def test_in_tree_plugins_declare_through_their_distribution():
    from nanocore.plugins import get_registry
    registry = get_registry()
    assert not any(registry.refused.values()) and not registry.failures


#: Public names added after 1.0, with the contract minor that added them (docs/internals.md, "Versioning").
SINCE_MINOR = {
    "nanocore.toolkit.reference": 1, "nanocore.toolkit.moe_weights": 2, "nanocore.toolkit.cuda_library": 3,
    "nanocore.toolkit.act_quant": 4, "SPLITK_MAX_M": 4, "weight_only_config": 4, "cuda_capability": 4,
    "sm_count": 4, "kernel_uses_triton": 4,
}


def _imported_public_names(package_dir) -> set[str]:
    """nanocore modules and names a plugin package imports (its tests excluded)."""
    import ast
    found = set()
    for path in package_dir.rglob("*.py"):
        if "tests" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanocore."):
                found |= {node.module} | {alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("nanocore.")}
    return found


def test_in_tree_plugins_require_the_minor_of_every_name_they_import():
    # a plugin importing a 1.4 name while requiring nanocore>=1.1 would install beside nanocore 1.1 and fail to import
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    checked = 0
    for pyproject in sorted(root.glob("plugins*/*/pyproject.toml")):
        required = re.search(r'"nanocore-llm>=1\.(\d+)', pyproject.read_text())
        assert required, f"{pyproject} does not require nanocore-llm>=1.N"
        packages = [p for p in pyproject.parent.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        needed = {name: minor for name, minor in SINCE_MINOR.items()
                  for package in packages if name in _imported_public_names(package)}
        too_new = {name: f"1.{minor}" for name, minor in needed.items() if minor > int(required.group(1))}
        assert not too_new, f"{pyproject.parent.name} requires nanocore>=1.{required.group(1)} but imports {too_new}"
        checked += 1
    assert checked >= 9  # every in-tree distribution was read
