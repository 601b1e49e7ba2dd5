"""What gets mutated: targets (a source file, the functions in it that compute, the conformance tests that
judge it) read from a TOML file, and each function's line span and source hash found with ``ast``."""
from __future__ import annotations

import ast
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


class TargetError(ValueError):
    """A targets file or target source that the tool cannot use; the message says what to fix."""


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    file: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]
    pytest_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Span:
    """Lines ``start``..``end`` (1-based, inclusive) of a function, the hash of its source, and the
    (line, col, end line, end col) of the code in it that is never mutated: type annotations (not evaluated)
    and whatever follows ``x.is_cuda and`` (never evaluated on CPU)."""

    start: int
    end: int
    sha: str
    skipped: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def key(self) -> str:
        """What a stored result was made from: the source and the parts of it left alone."""
        return hashlib.sha256(f"{self.sha}{self.skipped}".encode()).hexdigest()[:16]

    def holds(self, pos: tuple[int, int]) -> bool:
        inside = any((a[0], a[1]) <= pos < (a[2], a[3]) for a in self.skipped)
        return self.start <= pos[0] <= self.end and not inside


@dataclass(frozen=True)
class Plan:
    targets: tuple[Target, ...]
    exclude_operators: tuple[str, ...]

    def excluded(self, operator: str) -> bool:
        return any(re.search(pattern, operator) for pattern in self.exclude_operators)

    def select(self, kinds: list[str] | None, names: list[str] | None) -> list[Target]:
        chosen = [t for t in self.targets if (not kinds or t.kind in kinds) and (not names or t.name in names)]
        if not chosen:
            known = ", ".join(t.name for t in self.targets)
            raise TargetError(f"no target matches kinds={kinds} names={names}; the targets are: {known}")
        return chosen


def _target(entry: dict, where: str) -> Target:
    missing = [key for key in ("name", "kind", "file", "functions", "tests") if key not in entry]
    if missing:
        raise TargetError(f"{where}: a [[target]] lacks {missing}; each needs name, kind, file, functions, tests")
    return Target(entry["name"], entry["kind"], entry["file"], tuple(entry["functions"]), tuple(entry["tests"]),
                  tuple(entry.get("pytest_args", ())))


def load_plan(path: Path) -> Plan:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TargetError(f"cannot read the targets file {path}: {exc}") from exc
    targets = tuple(_target(entry, str(path)) for entry in data.get("target", []))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise TargetError(f"{path}: target names must be unique, got {names}")
    return Plan(targets, tuple(data.get("operators", {}).get("exclude", ())))


def _definitions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
        elif isinstance(node, ast.ClassDef):
            yield from _definitions(node, f"{prefix}{node.name}.")


def _cuda_only(sub: ast.AST) -> list[ast.AST]:
    """The operands after ``x.is_cuda`` in ``x.is_cuda and ...``: CPU code never evaluates them."""
    if not (isinstance(sub, ast.BoolOp) and isinstance(sub.op, ast.And)):
        return []
    first = sub.values[0]
    return sub.values[1:] if isinstance(first, ast.Attribute) and first.attr == "is_cuda" else []


def _skipped(node: ast.AST) -> tuple[tuple[int, int, int, int], ...]:
    found = []
    for sub in ast.walk(node):
        found += _cuda_only(sub)
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [a.annotation for a in [*sub.args.posonlyargs, *sub.args.args, *sub.args.kwonlyargs,
                                             sub.args.vararg, sub.args.kwarg] if a is not None and a.annotation]
            found += [sub.returns] if sub.returns else []
        elif isinstance(sub, ast.AnnAssign):
            found.append(sub.annotation)
    return tuple((a.lineno, a.col_offset, a.end_lineno, a.end_col_offset) for a in found)


def function_spans(source: str, qualnames: tuple[str, ...], where: str) -> dict[str, Span]:
    """Each qualname's span: from its ``def`` line (decorators are not mutated) to its last line."""
    lines = source.splitlines()
    found = dict(_definitions(ast.parse(source)))
    missing = [q for q in qualnames if q not in found]
    if missing:
        raise TargetError(f"{where} defines no {missing}; fix the target's functions (found: {sorted(found)})")
    spans = {}
    for qualname in qualnames:
        node = found[qualname]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        text = "\n".join(lines[first - 1:node.end_lineno])
        spans[qualname] = Span(node.lineno, node.end_lineno, hashlib.sha256(text.encode()).hexdigest()[:16],
                               _skipped(node))
    return spans


def owner(spans: dict[str, Span], pos: tuple[int, int]) -> str | None:
    """The target function whose span holds ``pos`` (line, column), outside skipped code (innermost first)."""
    holding = [(span.end - span.start, name) for name, span in spans.items() if span.holds(tuple(pos))]
    return min(holding)[1] if holding else None
