"""Runs one target's mutants with cosmic-ray: a scratch copy of the repository (mutants never touch the
checkout), a WorkDB per target (resumable), a filter that skips every mutation outside the target's functions
or in functions whose stored result is still current, then cosmic-ray's worker on each mutant, one at a time."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from cosmic_ray.commands import init
from cosmic_ray.mutating import mutate_and_test
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

from mutation_targets import Plan, Span, Target, owner

RUN_SUITE = Path(__file__).resolve().with_name("run_suite.py")
_SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".hypothesis", "*.egg-info", "build", "dist")


class BaselineError(RuntimeError):
    """The unmutated code fails its own tests, so no kill would mean anything."""


def sync_tree(repo: Path, scratch: Path) -> None:
    """Copy the checkout's files over the scratch copy (this also undoes a mutant left by an interrupted run)."""
    shutil.copytree(repo, scratch, ignore=_SKIP, dirs_exist_ok=True)


def test_env(scratch: Path) -> dict[str, str]:
    """The environment in which imports resolve to the scratch copy: every distribution root goes first."""
    roots = [scratch] + sorted(p.parent for p in scratch.glob("**/pyproject.toml") if p.parent != scratch)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, roots), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_command(target: Target) -> str:
    return shlex.join([sys.executable, str(RUN_SUITE), *target.pytest_args, *target.tests])


def prepare(target: Target, scratch: Path, work: Path, spans: dict[str, Span], plan: Plan,
            done: set[str]) -> tuple[Path, int]:
    """The target's WorkDB, reused when the source, operators, stored functions and judging suite are as before;
    and how many mutants still have to run."""
    db_path = work / f"{target.name.replace('/', '__')}.sqlite"
    meta_path = db_path.with_suffix(".json")
    module = scratch / target.file
    meta = {"spans": {name: span.sha for name, span in spans.items()}, "exclude": list(plan.exclude_operators),
            "done": sorted(done), "file": str(module), "suite": suite_fingerprint(scratch, target)}
    old = json.loads(meta_path.read_text()) if meta_path.exists() and db_path.exists() else None
    # more functions done only skips more; one no longer done needs its skipped mutants back: a new session
    if old is None or {**old, "done": None} != {**meta, "done": None} or not set(old["done"]) <= done:
        db_path.unlink(missing_ok=True)
        with use_db(str(db_path), WorkDB.Mode.create) as db:
            init([module], db, {})
    meta_path.write_text(json.dumps(meta, indent=1))
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        _skip_outside(db, spans, plan, done)  # a resumed session gets the current filter too
        return db_path, sum(1 for _ in db.pending_work_items)


def suite_fingerprint(scratch: Path, target: Target) -> str:
    """Hash of what judges the target: the conformance package and the target's test files (a changed suite needs
    a new session: outcomes stored under the old one would otherwise be reused)."""
    files = sorted((scratch / "conformance" / "nanocore_conformance").rglob("*.py"))
    files += sorted({scratch / test.split("::")[0] for test in target.tests})
    digest = hashlib.sha256()
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(scratch)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _skip_outside(db: WorkDB, spans: dict[str, Span], plan: Plan, done: set[str]) -> None:
    skipped = []
    for item in db.pending_work_items:
        mutation = item.mutations[0]
        function = owner(spans, mutation.start_pos)
        if function is None or function in done or plan.excluded(mutation.operator_name):
            skipped.append(item.job_id)
    db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))


def baseline(target: Target, scratch: Path, limit_s: float) -> float:
    """Seconds the unmutated tests take; raises BaselineError if they do not pass."""
    start = time.monotonic()
    try:
        proc = subprocess.run(shlex.split(test_command(target)), cwd=scratch, env=test_env(scratch),
                              capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired as exc:
        raise BaselineError(f"{target.name}: the unmutated tests ran past {limit_s:.0f} s") from exc
    if proc.returncode != 0:
        raise BaselineError(f"{target.name}: the unmutated tests fail (exit {proc.returncode}); fix them first:\n"
                            f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return time.monotonic() - start


def execute(target: Target, scratch: Path, db_path: Path, timeout_s: float, deadline: float | None,
            spans: dict[str, Span]) -> bool:
    """Run the pending mutants one by one, function by function (cosmic-ray's own worker, ``mutate_and_test``,
    as its ``local`` distributor does, but in source order so an interrupted run leaves whole functions done).
    False if stopped at ``deadline``; the WorkDB keeps every finished mutant for the next run."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(test_env(scratch))
    os.chdir(scratch)  # cosmic-ray runs the test command in the current directory
    try:
        with use_db(str(db_path), WorkDB.Mode.open) as db:
            pending = sorted(db.pending_work_items, key=lambda i: (i.mutations[0].start_pos, i.mutations[0].operator_name,
                                                                    i.mutations[0].occurrence))
            for number, item in enumerate(pending, 1):
                if deadline is not None and time.monotonic() > deadline:
                    return False
                start = time.monotonic()
                result = mutate_and_test(item.mutations, test_command(target), timeout_s)
                db.set_result(item.job_id, result)
                mutation = item.mutations[0]
                print(f"  [{number}/{len(pending)}] {owner(spans, mutation.start_pos)} line {mutation.start_pos[0]} "
                      f"{mutation.operator_name.removeprefix('core/')}: {_outcome(result)} "
                      f"({time.monotonic() - start:.0f} s)", flush=True)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return True


def _outcome(result: WorkResult) -> str | None:
    if result.worker_outcome == WorkerOutcome.NO_TEST:
        return None  # the operator found nothing to change here
    if result.worker_outcome != WorkerOutcome.NORMAL:
        return "error"
    if result.test_outcome == TestOutcome.KILLED:
        return "timeout" if result.output == "timeout" else "killed"
    return "survived" if result.test_outcome == TestOutcome.SURVIVED else "error"


def _change(diff: str) -> dict[str, str]:
    lines = diff.splitlines()
    before = [ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    after = [ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return {"before": " / ".join(before), "after": " / ".join(after)}


def collect(db_path: Path, spans: dict[str, Span], plan: Plan) -> dict[str, list[dict]]:
    """Mutant records of every target function whose mutants all have a result (the others stay pending)."""
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        results = dict(db.results)
        items = db.work_items
    per_function: dict[str, list] = defaultdict(list)
    for item in items:
        mutation = item.mutations[0]
        function = owner(spans, mutation.start_pos)
        if function is not None and not plan.excluded(mutation.operator_name):
            per_function[function].append((mutation, results.get(item.job_id)))
    complete = {function: [] for function in spans if function not in per_function}  # no mutant: nothing to wait for
    for function, entries in per_function.items():
        if any(r is None or r.worker_outcome == WorkerOutcome.SKIPPED for _, r in entries):
            continue
        complete[function] = _records(function, spans[function], entries)
    return complete


def _records(function: str, span: Span, entries: list) -> list[dict]:
    records, seen = [], defaultdict(int)
    for mutation, result in sorted(entries, key=lambda e: (e[0].start_pos, e[0].operator_name, e[0].occurrence)):
        outcome = _outcome(result)
        if outcome is None:
            continue
        line, col = mutation.start_pos
        key = f"{mutation.operator_name.removeprefix('core/')}@{line - span.start}:{col}"
        seen[key] += 1
        records.append({"id": f"{key}#{seen[key]}", "line": line, "outcome": outcome, **_change(result.diff or "")})
    return records
