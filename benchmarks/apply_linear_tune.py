"""Write the fastest kernels of a `nanocore tune linear` JSON into the source tables (the one place they live).

``python benchmarks/apply_linear_tune.py TUNE.json [REPO_ROOT]`` rewrites ``KERNEL_PLANS`` (nanocore/toolkit/
kernel_plan.py) after the split-K range and ``MMA_TILES`` (nanocore/toolkit/gemm_config.py) per weight format: at each
tuned M past ``SPLITK_MAX_M`` the fastest of the shipped plan, the swapped mma tiles and ``dequant`` (fp8's
``scaled_mm`` rounds activations: it stays out of the default, see docs/benchmarks-quant.md). Prints both tables.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from nanocore.toolkit.gemm_config import MMA_TILES, SPLITK_MAX_M, mma_config
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, METHOD_FORMATS


def winners(rows: list[dict], method: str) -> dict[int, tuple]:
    """M -> ("mma", tile) or ("dequant", None): the fastest allowed candidate per M past the split-K range."""
    fmt, out = METHOD_FORMATS[method], {}
    for m in sorted({r["m"] for r in rows if r["method"] == method and r["m"] > SPLITK_MAX_M}):
        ok = [r for r in rows if r["method"] == method and r["m"] == m and "ms" in r and r.get("rel_err", 0) < 0.05
              and (r["candidate"] in ("plan", "dequant") or r["candidate"].startswith("mma("))]
        best = min(ok, key=lambda r: r["ms"])
        if best["candidate"] == "dequant":
            out[m] = ("dequant", None)
        elif best["candidate"] == "plan":
            c = mma_config(m, 0, 0, fmt)
            out[m] = ("mma", (c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages))
        else:
            out[m] = ("mma", ast.literal_eval(best["candidate"][3:]))
    return out


def tables(rows: list[dict]) -> tuple[dict, dict]:
    plans, tiles = dict(KERNEL_PLANS), dict(MMA_TILES)
    for method, fmt in METHOD_FORMATS.items():
        won = winners(rows, method)
        if not won or method == "wna16":
            continue
        head = tuple(row for row in KERNEL_PLANS[fmt] if row[0] is not None and row[0] <= SPLITK_MAX_M)
        runs: list[list] = []
        for m, (kernel, tile) in won.items():
            if runs and runs[-1][1] == kernel:
                runs[-1][0] = m
            else:
                runs.append([m, kernel])
        plans[fmt] = head + tuple((m, k) for m, k in runs[:-1]) + ((None, runs[-1][1]),)
        mma = [(m, *tile) for m, (kernel, tile) in won.items() if kernel == "mma"]
        if mma:
            merged = [row for i, row in enumerate(mma) if i + 1 == len(mma) or mma[i + 1][1:] != row[1:]]
            tiles[fmt] = tuple(merged[:-1]) + ((None, *merged[-1][1:]),)
    return plans, tiles


def rewrite(path: Path, name: str, value: dict) -> None:
    text = path.read_text()
    body = "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in value.items()) + "}"
    new = re.sub(rf"^{name}(: [^=]+)? = \{{\n.*?^\}}", lambda mt: f"{name}{mt.group(1) or ''} = {body}", text,
                 count=1, flags=re.S | re.M)
    if new == text and body not in text:
        raise SystemExit(f"{path}: no {name} table found to rewrite")
    path.write_text(new)


def main() -> int:
    rows = json.loads(Path(sys.argv[1]).read_text())["rows"]
    root = Path(sys.argv[2] if len(sys.argv) > 2 else ".")
    plans, tiles = tables(rows)
    rewrite(root / "nanocore/toolkit/kernel_plan.py", "KERNEL_PLANS", plans)
    rewrite(root / "nanocore/toolkit/gemm_config.py", "MMA_TILES", tiles)
    print("KERNEL_PLANS", plans, "\nMMA_TILES", tiles, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
