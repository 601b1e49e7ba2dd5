"""``nanocore plugin new``: write a ready plugin distribution (pyproject, hookimpl, stub backend, tests)."""
from __future__ import annotations

import re
from pathlib import Path
from string import Template

from nanocore.interfaces import API_VERSION, KINDS
from nanocore.scaffold import files, stubs

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")


def plugin_layout(name: str, kind: str) -> dict[str, str]:
    """Placeholders shared by the templates."""
    camel = "".join(part.capitalize() for part in name.split("_"))
    return {
        "name": name, "kind": kind, "package": f"nanocore_{name}", "dist": f"nanocore-{name.replace('_', '-')}",
        "cls": camel + stubs.CLASS_SUFFIX[kind], "hook": KINDS[kind][1], "conformance": stubs.CONFORMANCE[kind],
        "kind_flag": kind.replace("_", "-"), "KIND": kind.upper(),
        "api_version": API_VERSION,
        "next_major": str(int(API_VERSION.split(".")[0]) + 1),
    }


def check_name(name: str, kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; kinds are {list(KINDS)}")
    if not NAME_PATTERN.match(name):
        raise ValueError(f"plugin name {name!r} must be lower case letters, digits and '_', starting with a letter "
                         f"(it is the backend name users select, e.g. 'my_awq')")
    from nanocore.plugins import get_registry

    taken = get_registry().entries[kind].get(name)
    if taken:
        raise ValueError(f"{kind} {name!r} is already registered by {taken[0].distribution}; choose another name")


def write_plugin(name: str, kind: str, target: str | Path | None = None) -> Path:
    """Write the distribution into the folder ``target`` (default ``./nanocore-NAME``) and return it.

    ``target`` is the distribution's own folder (it holds pyproject.toml), so ``pip install -e TARGET`` installs it.
    """
    check_name(name, kind)
    values = plugin_layout(name, kind)
    root = Path(target) if target is not None else Path(values["dist"])
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ValueError(f"{root} already exists and is not an empty folder; pick another --dir or remove it")
    contents = {
        "pyproject.toml": files.PYPROJECT,
        "README.md": files.README,
        f"{values['package']}/__init__.py": files.PACKAGE_INIT,
        f"{values['package']}/plugin.py": files.PLUGIN,
        f"{values['package']}/backend.py": stubs.HEADER + stubs.BACKENDS[kind],
        "tests/test_conformance.py": files.CONFORMANCE_TEST,
    }
    if kind in files.CONFTEST_KINDS:
        contents["tests/conftest.py"] = files.CONFTEST
    for relative, template in contents.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values))
    return root
