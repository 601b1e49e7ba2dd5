"""The size and wording rules the code base keeps: short files and functions, and no development history in the
product (git keeps that)."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 300  # nanocore/, conformance/ and plugins*/
MAX_FUNCTION_LINES = 60  # engine/ and runner/, where the step is read
HISTORY = re.compile(r"\b(development session|session \d+|issue #?\d+)\b|(?<![\w&])#\d{2,3}\b", re.IGNORECASE)


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def test_no_source_file_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in tracked("nanocore/*.py", "conformance/*.py", "plugins*/*.py")
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"split these files (over {MAX_FILE_LINES} lines): {long}"


def test_no_engine_or_runner_function_is_over_60_lines():
    long = []
    for path in tracked("nanocore/engine/*.py", "nanocore/runner/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"split these functions (over {MAX_FUNCTION_LINES} lines): {long}"


def test_the_product_does_not_narrate_its_development():
    files = tracked("nanocore/*", "conformance/*", "plugins*/*", "docs/*.md", "benchmarks/*", "README.md")
    hits = []
    for path in files:
        if path.suffix not in {".py", ".md", ".toml", ".sh", ".txt", ".cfg"}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "history belongs in git, not in the product:\n" + "\n".join(hits[:20])
