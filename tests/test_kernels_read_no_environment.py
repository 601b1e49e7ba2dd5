"""Kernels take their configuration as arguments: no module under nanocore/kernels/ reads an environment variable,
except ``TRITON_INTERPRET`` (whether Triton runs its interpreter). Checked over the AST, so a new read fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import nanocore

KERNELS = Path(nanocore.__file__).parent / "kernels"
ALLOWED = {"TRITON_INTERPRET"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb"}


def _key(use: ast.AST, parents: dict) -> str | None:
    """The literal variable name an environment access reads (``os.environ.get("X")``, ``os.environ["X"]``,
    ``os.getenv("X")``), or None when it is not one literal read."""
    parent = parents.get(use)
    if isinstance(parent, ast.Attribute) and parent.attr == "get":  # os.environ.get(...)
        use, parent = parent, parents.get(parent)
    if isinstance(parent, ast.Call) and parent.func is use and parent.args:
        arg = parent.args[0]
    elif isinstance(parent, ast.Subscript) and parent.value is use:
        arg = parent.slice
    else:
        return None
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def environment_reads(source: str) -> list[tuple[int, str | None]]:
    """(line, variable or None) of every environment access in ``source`` that is not an allowed literal read."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, None) for a in node.names if a.name in ENV_NAMES]  # a bare environ hides reads
        elif isinstance(node, ast.Attribute) and node.attr in ENV_NAMES:
            key = _key(node, parents)
            if key not in ALLOWED:
                found.append((node.lineno, key))
    return found


def test_no_module_under_kernels_reads_the_environment():
    files = sorted(KERNELS.rglob("*.py"))
    assert files, KERNELS
    reads = {str(f.relative_to(KERNELS)): r for f in files if (r := environment_reads(f.read_text()))}
    assert not reads, f"kernels read the environment (pass the value as an argument instead): {reads}"


def test_the_check_finds_each_form_of_read():
    assert environment_reads('import os\nx = os.environ.get("TRITON_INTERPRET") == "1"\n') == []
    assert environment_reads('import os\nx = os.environ["TRITON_INTERPRET"]\n') == []
    assert environment_reads('import os\nx = os.environ.get("NANOCORE_ATTN_QUANT_PATH")\n') == [
        (2, "NANOCORE_ATTN_QUANT_PATH")]
    assert environment_reads('import os\nx = os.getenv("A", "1")\n') == [(2, "A")]
    assert environment_reads('import os\nx = os.environ["B"]\n') == [(2, "B")]
    assert environment_reads('import os\nenv = os.environ\n') == [(2, None)]
    assert environment_reads('import os\nname = "A"\nx = os.environ.get(name)\n') == [(3, None)]
    assert environment_reads('from os import environ\n') == [(1, None)]
    assert environment_reads('from os import getenv as g\n') == [(1, None)]
