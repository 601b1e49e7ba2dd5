"""``nanocore plugins``: every backend by kind (name, distribution, version, supported here or why not)
and every plugin that failed to load, with its error.

``--json`` prints a list of objects with keys ``kind, name, distribution, version, supported, reason``;
failed plugins appear in it with ``kind = "failed_plugin"``, ``name`` = the plugin (entry-point) name,
``supported = false`` and ``reason`` = the error.
"""
from __future__ import annotations

import json

FAILED_KIND = "failed_plugin"
COLUMNS = ("kind", "name", "distribution", "version", "supported")


def register(subparsers) -> None:
    p = subparsers.add_parser("plugins", help="list installed backends and failed plugins")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--device", default=None, help="device to check support on (default: cuda if available, else cpu)")
    p.set_defaults(func=run)


def plugin_rows(device: str | None = None) -> list[dict]:
    """Backend rows (Registry.rows) followed by one row per failed plugin."""
    import torch

    from nanocore.plugins import get_registry

    registry = get_registry()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = registry.rows(device)
    for failure in registry.failures:
        rows.append({"kind": FAILED_KIND, "name": failure.plugin, "distribution": failure.distribution,
                     "version": failure.version, "supported": False, "reason": failure.error})
    return rows


def format_table(rows: list[dict]) -> str:
    backends = [r for r in rows if r["kind"] != FAILED_KIND]
    cells = [[r["kind"], r["name"], r["distribution"] or "-", r["version"] or "-",
              "yes" if r["supported"] else f"no: {r['reason']}"] for r in backends]
    widths = [max(len(str(c)) for c in column) for column in zip(COLUMNS, *cells)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [list(COLUMNS), *cells]]
    failed = [r for r in rows if r["kind"] == FAILED_KIND]
    if failed:
        lines += ["", "failed plugins (skipped; the rest work):"]
        lines += [f"  {r['name']} ({r['distribution']} {r['version']}): {r['reason']}" for r in failed]
    return "\n".join(lines)


def run(args) -> int:
    rows = plugin_rows(args.device)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
