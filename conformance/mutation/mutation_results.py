"""The stored results (one JSON file in the repository: per target, per function, its source hash and every
mutant's outcome), the triage of survivors (``equivalent`` entries with a reason), and the per-kind report."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from mutation_targets import Span, Target, TargetError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

EQUIVALENT_SHARE_LIMIT = 0.10  # more than this share of a kind's mutants called equivalent hides holes
TARGET_KILL_RATE = 0.95


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"targets": {}}


def save(path: Path, results: dict) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def current(results: dict, target: Target, spans: dict[str, Span]) -> set[str]:
    """Functions whose stored result was made from the same source (same hash): they need no re-run."""
    stored = results["targets"].get(target.name, {}).get("functions", {})
    return {name for name, span in spans.items() if stored.get(name, {}).get("sha") == span.key}


def merge(results: dict, target: Target, spans: dict[str, Span], records: dict[str, list[dict]], run: dict) -> None:
    """Store the functions just run; drop stored functions the target no longer lists."""
    entry = results["targets"].setdefault(target.name, {"functions": {}})
    entry.update(kind=target.kind, file=target.file, tests=list(target.tests))
    functions = {name: f for name, f in entry["functions"].items() if name in spans}
    for name, mutants in records.items():
        functions[name] = {"sha": spans[name].key, "mutants": mutants, **run}
    entry["functions"] = functions


def drop_stale(results: dict, target: Target, spans: dict[str, Span]) -> None:
    """Forget stored functions made from another source than the current one: run anew, they left no mutant."""
    functions = results["targets"].get(target.name, {}).get("functions", {})
    for name in [n for n, f in functions.items() if n in spans and f.get("sha") != spans[n].key]:
        del functions[name]


def load_triage(path: Path) -> dict[tuple[str, str, str], str]:
    """(target, function, mutant id) -> why the mutant is equivalent (behaves exactly like the original)."""
    if not path.exists():
        return {}
    triage = {}
    for item in tomllib.loads(path.read_text()).get("equivalent", []):
        if not item.get("reason"):
            raise TargetError(f"{path}: every [[equivalent]] needs a reason, {item} has none")
        triage[(item["target"], item["function"], item["mutant"])] = item["reason"]
    return triage


def _survivors(results: dict, triage: dict) -> list[dict]:
    rows = []
    for target, entry in results["targets"].items():
        for function, data in entry["functions"].items():
            for mutant in data["mutants"]:
                if mutant["outcome"] == "survived":
                    reason = triage.get((target, function, mutant["id"]))
                    rows.append({"kind": entry["kind"], "target": target, "function": function, **mutant,
                                 "equivalent": reason})
    return rows


def summary(results: dict, triage: dict, by: str = "kind") -> dict[str, dict]:
    """Per kind (or per target): mutants, killed (timeouts included), survived, equivalent, errors, kill rate."""
    kinds: dict[str, dict] = defaultdict(lambda: {"mutants": 0, "killed": 0, "survived": 0, "equivalent": 0,
                                                  "errors": 0, "targets": set(), "commits": set(), "dates": set(),
                                                  "seconds": 0.0})
    for target, entry in results["targets"].items():
        row = kinds[entry["kind"] if by == "kind" else target]
        row["targets"].add(target)
        for function, data in entry["functions"].items():
            row["commits"].add(data["commit"])
            row["dates"].add(data["date"])
            row["seconds"] += data.get("seconds", 0.0)
            for mutant in data["mutants"]:
                row["mutants"] += 1
                outcome = mutant["outcome"]
                if outcome in ("killed", "timeout"):
                    row["killed"] += 1
                elif outcome == "survived":
                    row["survived"] += 1
                    row["equivalent"] += (target, function, mutant["id"]) in triage
                else:
                    row["errors"] += 1
    for row in kinds.values():
        judged = row["mutants"] - row["equivalent"] - row["errors"]
        row["kill_rate"] = row["killed"] / judged if judged else None
    return dict(kinds)


def _table(kinds: dict, by: str = "kind") -> list[str]:
    head = "| kind | targets |" if by == "kind" else "| target |"
    lines = [f"{head} mutants | killed | survived | equivalent | kill rate (non-equivalent) | minutes | commit | date |",
             "|---" * (head.count("|") + 7) + "|"]
    for key, row in sorted(kinds.items()):
        rate = "n/a" if row["kill_rate"] is None else f"{100 * row['kill_rate']:.1f}%"
        first = f"| {key} | {', '.join(sorted(row['targets']))} |" if by == "kind" else f"| {key} |"
        lines.append(f"{first} {row['mutants']} | {row['killed']} | {row['survived']} | {row['equivalent']} | "
                     f"{rate} | {row['seconds'] / 60:.0f} | {', '.join(sorted(row['commits']))} | "
                     f"{', '.join(sorted(row['dates']))} |")
    return lines


def warnings(kinds: dict, results: dict, triage: dict) -> list[str]:
    survivors = {(s["target"], s["function"], s["id"]) for s in _survivors(results, triage)}
    notes = [f"triage entry {key} matches no surviving mutant (its function changed or it is killed now); "
             f"remove or update it" for key in triage if key not in survivors]
    for kind, row in sorted(kinds.items()):
        if row["equivalent"] > EQUIVALENT_SHARE_LIMIT * row["mutants"]:
            notes.append(f"{kind}: {row['equivalent']} of {row['mutants']} mutants are called equivalent, above "
                         f"{EQUIVALENT_SHARE_LIMIT:.0%}; re-check them")
        if row["errors"]:
            notes.append(f"{kind}: {row['errors']} mutants ended in a worker error (not counted); see results.json")
        if row["kill_rate"] is not None and row["kill_rate"] < TARGET_KILL_RATE:
            notes.append(f"{kind}: kill rate {100 * row['kill_rate']:.1f}% is below {TARGET_KILL_RATE:.0%}; "
                         f"every hole below is a case the suite misses")
    return notes


def render(results: dict, triage: dict) -> str:
    kinds = summary(results, triage)
    lines = ["# Conformance mutation results", "",
             "Generated by `python conformance/mutation/mutate.py report` from `results.json` and `triage.toml`.",
             "", *_table(kinds), "", *_table(summary(results, triage, by="target"), by="target"), ""]
    lines += [f"- {note}" for note in warnings(kinds, results, triage)] + [""]
    survivors = _survivors(results, triage)
    for title, equivalent in (("Holes (surviving mutants the suite should kill)", False),
                              ("Equivalent mutants", True)):
        rows = [s for s in survivors if bool(s["equivalent"]) == equivalent]
        lines += [f"## {title}: {len(rows)}", ""]
        for s in sorted(rows, key=lambda s: (s["kind"], s["target"], s["line"], s["id"])):
            why = f" Equivalent: {s['equivalent']}" if equivalent else ""
            lines.append(f"- `{s['target']}` `{s['function']}` line {s['line']} `{s['id']}`: "
                         f"`{s['before']}` -> `{s['after']}`.{why}")
        lines.append("")
    return "\n".join(lines)
