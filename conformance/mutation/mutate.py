"""Mutation testing of the in-tree backends and builtin oracles, judged only by the conformance suite.

    python conformance/mutation/mutate.py run [--kind K] [--target NAME] [--max-minutes N] [--force]
    python conformance/mutation/mutate.py report

``run`` mutates (cosmic-ray) the functions each target in ``targets.toml`` lists, runs that target's conformance
tests against every mutant and stores each function's outcome with its source hash in ``results.json``: a later
run skips functions whose source is unchanged and resumes an interrupted one. ``report`` writes ``results.md``.
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import mutation_results
from mutation_targets import TargetError, function_spans, load_plan

try:
    import mutation_session
except ModuleNotFoundError as exc:
    if exc.name != "cosmic_ray":
        raise
    sys.exit("error: mutate.py needs cosmic-ray: pip install 'cosmic-ray>=8.7,<9' (it is in nanocore's `test` extra)")

HERE = Path(__file__).resolve().parent


def _commit(repo: Path, file: str) -> str:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--", file) else "")


def run_target(target, plan, args, results: dict, deadline: float | None) -> bool:
    """Run one target's pending mutants and store its finished functions; False if stopped at the deadline."""
    source = (args.repo / target.file).read_text()
    spans = function_spans(source, target.functions, target.file)
    done = set() if args.force else mutation_results.current(results, target, spans)
    scratch = args.work_dir / "tree"
    mutation_session.sync_tree(args.repo, scratch)
    db_path, pending = mutation_session.prepare(target, scratch, args.work_dir, spans, plan, done)
    print(f"{target.name}: {len(done)} of {len(spans)} functions unchanged since their stored run, "
          f"{pending} mutants to run", flush=True)
    finished, elapsed, run = True, 0.0, {"commit": _commit(args.repo, target.file),
                                         "date": datetime.date.today().isoformat()}
    ran_before = set(mutation_session.collect(db_path, spans, plan))  # finished in an earlier session
    if pending:
        base_s = mutation_session.baseline(target, scratch, args.test_limit)
        timeout_s = max(args.min_timeout, args.timeout_factor * base_s)
        print(f"  baseline {base_s:.1f} s, timeout per mutant {timeout_s:.0f} s", flush=True)
        run.update(baseline_s=round(base_s, 1), timeout_s=round(timeout_s))
        start = time.monotonic()
        finished = mutation_session.execute(target, scratch, db_path, timeout_s, deadline, spans)
        elapsed = time.monotonic() - start
    records = {name: recs for name, recs in mutation_session.collect(db_path, spans, plan).items()
               if name not in done}
    stored = results["targets"].get(target.name, {}).get("functions", {})
    total = sum(len(r) for n, r in records.items() if n not in ran_before) or 1
    for name, recs in records.items():
        if name in ran_before and name in stored:  # run before, filtered anew: keep when and how it ran
            info = {k: v for k, v in stored[name].items() if k not in ("sha", "mutants")}
        else:  # the run's time, shared by mutant count
            info = dict(run, seconds=round(elapsed * len(recs) / total, 1))
        mutation_results.merge(results, target, spans, {name: recs}, info)
    mutation_results.merge(results, target, spans, {}, {})  # drops functions the target no longer lists
    if finished:  # a changed function with no mutant left keeps no outcome of its old source
        mutation_results.drop_stale(results, target, spans)
    mutation_results.save(args.results, results)
    return finished


def cmd_run(args) -> int:
    plan = load_plan(args.targets)
    results = mutation_results.load(args.results)
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    for target in plan.select(args.kind, args.target):
        if not run_target(target, plan, args, results, deadline):
            print(f"stopped after {args.max_minutes} min; run the same command again to resume", flush=True)
            break
    return cmd_report(args)


def cmd_report(args) -> int:
    results = mutation_results.load(args.results)
    triage = mutation_results.load_triage(args.triage)
    text = mutation_results.render(results, triage)
    args.results.with_suffix(".md").write_text(text + "\n")
    print(text.split("## ")[0])
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "report"])
    p.add_argument("--kind", action="append", help="only targets of this kind (repeatable)")
    p.add_argument("--target", action="append", help="only this target, e.g. prefix_cache/hash (repeatable)")
    p.add_argument("--force", action="store_true", help="re-run functions whose stored result is current")
    p.add_argument("--max-minutes", type=float, help="stop (resumably) after this long")
    p.add_argument("--min-timeout", type=float, default=60.0, help="least seconds a mutant's tests may take")
    p.add_argument("--timeout-factor", type=float, default=4.0, help="mutant timeout = this x the baseline")
    p.add_argument("--test-limit", type=float, default=900.0, help="seconds the baseline run may take")
    p.add_argument("--repo", type=Path, default=HERE.parent.parent)
    p.add_argument("--targets", type=Path, default=HERE / "targets.toml")
    p.add_argument("--results", type=Path, default=HERE / "results.json")
    p.add_argument("--triage", type=Path, default=HERE / "triage.toml")
    p.add_argument("--work-dir", type=Path, help="scratch copy of the repository and the resumable cosmic-ray "
                   "sessions (default: ~/.cache/nanocore-conformance-mutation/<checkout>)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.repo = args.repo.resolve()
    checkout = f"{args.repo.name}-{hashlib.sha256(str(args.repo).encode()).hexdigest()[:8]}"
    args.work_dir = (args.work_dir or Path.home() / ".cache" / "nanocore-conformance-mutation" / checkout).resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    try:
        if args.command == "report":
            return cmd_report(args)
        with (args.work_dir / "lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # two runs would mutate the same scratch copy
            except BlockingIOError:
                raise TargetError(f"another mutate.py run is using {args.work_dir}; wait for it or pass "
                                  f"another --work-dir") from None
            return cmd_run(args)
    except (TargetError, mutation_session.BaselineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
