"""Sequence state has one owner: only the scheduler and the block manager (and Sequence itself) write it.

Read over the AST: an assignment to an attribute named like one of ``Sequence``'s slots, on an object that is not
``self`` or an attribute of ``self`` (a class writing its own fields), or a call of ``append_token``, anywhere in
``nanocore/`` outside those three files, fails (the conformance suite's simulator has sequences of its own).
"""
from __future__ import annotations

import ast
from pathlib import Path

from nanocore.engine.sequence import Sequence

ROOT = Path(__file__).resolve().parents[1]
OWNERS = {"nanocore/engine/scheduler.py", "nanocore/engine/block_manager.py", "nanocore/engine/sequence.py"}
SLOTS = set(Sequence.__slots__)


def _own_field(target: ast.Attribute) -> bool:
    """``self.x = ...`` or ``self.y.x = ...``: a class's own state, not a sequence reached through a name."""
    value = target.value
    if isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name) and value.id == "self"


def sequence_writes(source: str) -> list[tuple[int, str]]:
    writes = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "append_token"):
            writes.append((node.lineno, ast.unparse(node)))
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and t.attr in SLOTS and not _own_field(t):
                    writes.append((node.lineno, ast.unparse(t)))
    return writes


def test_the_check_finds_writes():
    found = sequence_writes("seq.status = 1\nseq.finish_reason, x = 'stop', 2\nv.num_computed_tokens += 3\n"
                            "seq.append_token(5)\nself.status = 4\nself.stats.num_cached_tokens = 6\n")
    assert [line for line, _ in found] == [1, 2, 3, 4]


def test_only_the_scheduler_and_the_block_manager_write_sequences():
    offenders = []
    for path in sorted((ROOT / "nanocore").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in OWNERS:
            continue
        offenders += [f"{relative}:{line}: {what}" for line, what in sequence_writes(path.read_text())]
    assert offenders == [], "sequence state written outside the scheduler / block manager:\n" + "\n".join(offenders)
