"""Which ``nanocore`` modules a backend's source imports, and which of those are not the public plugin surface."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

#: What a plugin may import from nanocore: the contract, the toolkit, and the top-level ``hookimpl``.
PUBLIC_SURFACE = ("nanocore.hookspecs", "nanocore.interfaces", "nanocore.toolkit", "nanocore.hookimpl",
                  "nanocore.API_VERSION")


def nanocore_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``import nanocore...`` / ``from nanocore... import`` in a file, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "nanocore"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nanocore":
            # "from nanocore import hookimpl": the name itself is what is imported
            modules = [f"{node.module}.{a.name}" for a in node.names] if node.module == "nanocore" else [node.module]
            found += [(node.lineno, m) for m in modules]
    return found


def is_public(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PUBLIC_SURFACE)


def imports_outside_surface(root: Path) -> list[str]:
    """``file:line imports module`` for every non-public nanocore import in a file or a package folder."""
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    return [f"{path}:{line} imports {module}" for path in files for line, module in nanocore_imports(path)
            if not is_public(module)]


def source_root(cls: type) -> Path | None:
    """The folder of the top-level package defining ``cls`` (or its single file); None if it has no source."""
    top = sys.modules.get(cls.__module__.split(".")[0])
    file = getattr(top, "__file__", None) or getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not file:
        return None
    path = Path(file)
    return path.parent if path.name == "__init__.py" else path
