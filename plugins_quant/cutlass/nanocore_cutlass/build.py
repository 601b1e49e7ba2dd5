"""Compile-on-first-use of the CUTLASS extension, its cache, and every reason it cannot be built here.

The CUDA sources ship in ``csrc/``; the CUTLASS / CuTe headers come from the ``nvidia-cutlass`` wheel
(found without importing it: its Python side needs cuda-python, the headers do not) or from
``$NANOCORE_CUTLASS_DIR``. Builds land in ``$NANOCORE_CACHE_DIR/cutlass/<key>`` (default
``~/.cache/nanocore/cutlass``), keyed by the sources, flags, torch/CUDA versions and header location, so a
second process loads the compiled module in about a second. A failed build leaves ``FAILED`` and
``build.log`` there: ``supports()`` reports it instead of compiling again (delete the folder to retry).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import torch

from nanocore.toolkit.cuda_library import compiler_identity, record_failure, recorded_failure
from nanocore.toolkit.paths import cache_dir

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("bindings.cpp", "quantize_fp8.cu", "fp8_gemm_sm90_bf16.cu", "fp8_gemm_sm90_fp16.cu")
CUDA_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "--expt-relaxed-constexpr",
              "-DNDEBUG", "-DCUTLASS_DEBUG_TRACE_LEVEL=0", "-DCUTE_USE_PACKED_TUPLE=1"]
CXX_FLAGS = ["-O3", "-DNDEBUG"]
CUTLASS_HEADER = Path("cutlass") / "cutlass.h"
PIP_HINT = "pip install nvidia-cutlass (or set NANOCORE_CUTLASS_DIR to a CUTLASS checkout)"

_loaded: dict[str, ModuleType] = {}  # cache key -> extension module, per process


class CutlassBuildError(RuntimeError):
    """The extension could not be compiled or loaded; the message says why and where the log is."""


def cache_root() -> Path:
    """``$NANOCORE_CACHE_DIR/cutlass`` (default ``~/.cache/nanocore/cutlass``), as the core resolves its cache."""
    return cache_dir() / "cutlass"


def _include_dirs_under(root: Path) -> list[Path] | None:
    """[include, tools/util/include] of a CUTLASS tree: ``root`` is the tree or its include dir."""
    for include in (root / "include", root):
        if (include / CUTLASS_HEADER).is_file():
            util = include.parent / "tools" / "util" / "include"
            return [include, util] if (util / "cutlass" / "util" / "packed_stride.hpp").is_file() else None
    return None


def _wheel_roots() -> list[Path]:
    """Where the nvidia-cutlass wheel put ``cutlass_library`` (its headers live in ``cutlass_library/source``)."""
    roots = []
    spec = importlib.util.find_spec("cutlass_library")  # finds a top-level package without executing it
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution("nvidia-cutlass")
        roots.append(Path(dist.locate_file("cutlass_library")))
    except importlib.metadata.PackageNotFoundError:
        pass
    return roots


def cutlass_include_dirs() -> tuple[list[Path] | None, str]:
    """(include dirs, where they came from), or (None, the reason they were not found)."""
    override = os.environ.get("NANOCORE_CUTLASS_DIR")
    if override:
        dirs = _include_dirs_under(Path(override).expanduser())
        if dirs:
            return dirs, f"NANOCORE_CUTLASS_DIR={override}"
        return None, (f"NANOCORE_CUTLASS_DIR={override} holds no CUTLASS headers (expected include/{CUTLASS_HEADER} "
                      f"and tools/util/include/cutlass/util/packed_stride.hpp)")
    for root in _wheel_roots():
        dirs = _include_dirs_under(root / "source")
        if dirs:
            return dirs, f"nvidia-cutlass at {root}"
    return None, f"the CUTLASS headers were not found: {PIP_HINT}"


def nvcc_path() -> str | None:
    """The nvcc torch's extension builder will run (``$CUDA_HOME/bin/nvcc``, as torch finds CUDA_HOME)."""
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME) / "bin" / "nvcc" if CUDA_HOME else None
    return str(nvcc) if nvcc is not None and nvcc.is_file() else None


def toolchain_reason() -> str | None:
    """Why the extension cannot be compiled here (no nvcc, no ninja, no headers), or None."""
    if nvcc_path() is None:
        return ("cutlass compiles its kernel on first use and needs nvcc, which torch.utils.cpp_extension did not "
                "find: install the CUDA toolkit or set CUDA_HOME to it")
    if shutil.which("ninja") is None:
        return "cutlass compiles its kernel with torch.utils.cpp_extension, which needs ninja: pip install ninja"
    dirs, why = cutlass_include_dirs()
    return None if dirs else f"cutlass needs the CUTLASS headers to compile its kernel: {why}"


def build_key(include_dirs: list[Path]) -> str:
    """Hash of everything that changes the binary: sources, flags, torch / CUDA versions, the compiler (path, size,
    mtime: a new toolkit gets a new key) and the headers (location and CUTLASS's version.h), so a build that failed
    with an old toolchain is not reported again once it is upgraded."""
    digest = hashlib.sha256()
    for name in sorted(p.name for p in CSRC.iterdir() if p.is_file()):
        digest.update(name.encode() + (CSRC / name).read_bytes())
    for part in (CUDA_FLAGS, CXX_FLAGS, torch.__version__, torch.version.cuda, [str(d) for d in include_dirs],
                 compiler_identity(nvcc_path())):
        digest.update(repr(part).encode())
    for directory in include_dirs:
        version_h = Path(directory) / "cutlass" / "version.h"
        if version_h.is_file():
            digest.update(version_h.read_bytes())
    return digest.hexdigest()[:16]


def build_dir() -> Path | None:
    dirs, _ = cutlass_include_dirs()
    return None if dirs is None else cache_root() / build_key(dirs)


def cached_failure() -> str | None:
    """The reason a previous build of these exact sources failed (kept in the cache), or None."""
    directory = build_dir()
    return recorded_failure(directory) if directory else None


def load_extension(verbose: bool = False) -> ModuleType:
    """The compiled extension: built now (tens of seconds, once per cache key) or loaded from the cache."""
    reason = toolchain_reason()
    if reason:
        raise CutlassBuildError(reason)
    dirs, _ = cutlass_include_dirs()
    key = build_key(dirs)
    if key in _loaded:
        return _loaded[key]
    directory = cache_root() / key
    failure = cached_failure()
    if failure:
        raise CutlassBuildError(failure)
    directory.mkdir(parents=True, exist_ok=True)
    from torch.utils.cpp_extension import load

    try:
        module = load(name=f"nanocore_cutlass_{key}", sources=[str(CSRC / s) for s in SOURCES],
                      extra_include_paths=[str(CSRC)] + [str(d) for d in dirs], extra_cflags=CXX_FLAGS,
                      extra_cuda_cflags=CUDA_FLAGS, build_directory=str(directory), verbose=verbose)
    except Exception as exc:  # the compiler's output is in the exception: keep it next to the build
        message = record_failure(directory, f"cutlass: compiling the CUTLASS kernel failed ({type(exc).__name__})",
                                 f"{type(exc).__name__}: {exc}\n")
        raise CutlassBuildError(message) from exc
    _loaded[key] = module
    return module
