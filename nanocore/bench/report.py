"""What every benchmark and eval result carries: a short table for people, JSON with provenance."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def git_commit() -> str | None:
    """The checkout's commit (with '-dirty' when it has local changes), or None outside git.

    ``NANOCORE_GIT_COMMIT`` overrides it: a copied tree whose .git is stale (the GPU machine's) names the
    commit the caller passes in."""
    if os.environ.get("NANOCORE_GIT_COMMIT"):
        return os.environ["NANOCORE_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def environment(device: str | None = None) -> dict[str, Any]:
    """Versions, machine and commit, for the JSON of a result."""
    import torch
    import transformers

    import nanocore

    env = {
        "nanocore": nanocore.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "git_commit": git_commit(), "device": device,
    }
    if device and device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    return env


def format_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """Plain aligned columns; floats with 4 significant digits."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def write_json(path: str | os.PathLike | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def config_summary(config) -> dict[str, Any]:
    """The EngineConfig fields a reader of a result needs (all of them, JSON-safe)."""
    return json.loads(config.model_dump_json())
