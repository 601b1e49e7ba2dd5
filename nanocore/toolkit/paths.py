"""Where nanocore and its plugins keep files between runs (converted models, compiled kernels, tuned configs)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$NANOCORE_CACHE_DIR``, default ``~/.cache/nanocore``; a plugin uses a sub-folder named after itself."""
    return Path(os.environ.get("NANOCORE_CACHE_DIR") or Path.home() / ".cache" / "nanocore")
