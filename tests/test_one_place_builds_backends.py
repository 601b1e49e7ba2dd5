"""One place builds backends: the registry (``Registry.build`` / ``Registry.instantiate`` in nanocore/plugins.py,
``cls(*context, options=options)``). Checked over the AST of the product code: no other module calls a registry
entry's ``.cls``, directly or through a name bound to it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "nanocore" / "plugins.py"


def product_files() -> list[Path]:
    """The core, the conformance suite, the in-tree plugins and the benchmarks, without their tests."""
    files = [*ROOT.glob("nanocore/**/*.py"), *ROOT.glob("conformance/**/*.py"), *ROOT.glob("plugins*/**/*.py"),
             *ROOT.glob("benchmarks/**/*.py")]
    return sorted(f for f in files if "tests" not in f.relative_to(ROOT).parts and f != REGISTRY)


def _is_cls(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "cls"


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` outside the functions nested in it."""
    for child in ast.iter_child_nodes(scope):
        yield child
        if not isinstance(child, FUNCTIONS):
            yield from _own_nodes(child)


def constructions(source: str) -> list[int]:
    """Lines where ``source`` constructs an entry's class: ``x.cls(...)``, or ``c = x.cls`` then ``c(...)`` in the
    same function (or module body)."""
    tree = ast.parse(source)
    lines = []
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, FUNCTIONS))]
    for scope in scopes:
        body = list(_own_nodes(scope))
        bound = {t.id for n in body if isinstance(n, (ast.Assign, ast.NamedExpr)) and _is_cls(n.value)
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        for n in body:
            if isinstance(n, ast.Call) and (_is_cls(n.func) or (isinstance(n.func, ast.Name) and n.func.id in bound)):
                lines.append(n.lineno)
    return sorted(set(lines))


def test_no_module_but_the_registry_constructs_a_backend():
    files = product_files()
    assert len(files) > 50, files
    found = {str(f.relative_to(ROOT)): lines for f in files if (lines := constructions(f.read_text()))}
    assert not found, (f"backends constructed outside the registry (use get_registry().build(kind, name, device, "
                       f"options, *context) or .instantiate(entry, options, *context)): {found}")


def test_the_check_finds_each_form():
    assert constructions("codec = registry.get('kv_codec', 'int8').cls()\n") == [1]
    assert constructions("def f(entry):\n    return entry.cls(dict(options))\n") == [2]
    assert constructions("def f(entry):\n    cls = entry.cls\n    return cls.supports(d), cls({})\n") == [3]
    assert constructions("x = {n: reg.resolve('moe_executor', n, 'cuda').cls() for n in names}\n") == [1]
    assert constructions("def f(entry):\n    return entry.cls.supports(device)\n") == []  # classmethods are fine
    assert constructions("def f(reg, e):\n    return reg.instantiate(e, None, 16, 8)\n") == []
    assert constructions("def f(e):\n    cls = e.cls\n\ndef g(cls):\n    return cls()\n") == []  # another scope
