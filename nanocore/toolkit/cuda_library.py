"""Compile-on-first-use of a plugin's CUDA C++ kernels into a shared library called through ``ctypes``.

A plugin ships ``.cu`` sources whose kernels are launched from ``extern "C"`` functions taking raw pointers and a
``cudaStream_t`` (pass ``torch.cuda.current_stream().cuda_stream``: launches then join CUDA-graph capture like any
torch kernel). :func:`load_cuda_library` compiles them with ``nvcc`` alone (no torch headers, no ninja: seconds,
not minutes) into ``$NANOCORE_CACHE_DIR/cuda/<name>-<key>/`` keyed by the sources, the flags and the compiler, so
later processes load the cached library at once. A failed build leaves ``FAILED`` and ``build.log`` there and
:func:`cached_failure` reports it instead of compiling again (delete the folder to retry). A plugin with its own
build (e.g. torch's extension builder) keeps the same convention with :func:`record_failure`,
:func:`recorded_failure` and :func:`compiler_identity`.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from nanocore.toolkit.paths import cache_dir

_loaded: dict[tuple, ctypes.CDLL] = {}  # (name, sources, flags) -> library, per process: no hashing per call


class CudaBuildError(RuntimeError):
    """The library could not be compiled or loaded; the message says why and where the compiler's log is."""


def nvcc_path() -> str | None:
    """``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``), else ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def toolchain_reason(what: str) -> str | None:
    """Why ``what`` cannot be compiled here, or None."""
    if nvcc_path() is None:
        return (f"{what} compiles its CUDA kernels on first use and needs nvcc: install the CUDA toolkit or set "
                f"CUDA_HOME to it")
    return None


def arch_flags(capability: tuple[int, int]) -> list[str]:
    """``-gencode`` for one device capability, e.g. (9, 0) -> sm_90 (SASS only: compiled for the GPU at hand)."""
    major, minor = capability
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def compiler_identity(path: str | None) -> tuple:
    """(path, size, mtime) of a compiler, for cache keys: a new toolkit gets a new key (and no stale failure)."""
    if path is None:
        return ()
    stat = Path(path).stat()
    return path, stat.st_size, int(stat.st_mtime)


def build_folder(name: str, sources: list[Path], flags: list[str]) -> Path:
    """Where the library of these sources and flags is cached (the key hashes sources, flags and the compiler)."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + source.read_bytes())
    digest.update(repr((flags, compiler_identity(nvcc_path()))).encode())
    return cache_dir() / "cuda" / f"{name}-{digest.hexdigest()[:16]}"


def recorded_failure(folder: Path) -> str | None:
    """The message a failed build left in ``folder`` (its ``FAILED`` marker), or None."""
    marker = folder / "FAILED"
    return marker.read_text() if marker.is_file() else None


def record_failure(folder: Path, what: str, compiler_output: str) -> str:
    """Keep a rejected build's output in ``folder/build.log`` and mark the folder ``FAILED`` (so later processes
    report it instead of compiling again); returns the message, which names the log and how to retry."""
    log = folder / "build.log"
    log.write_text(compiler_output)
    message = f"{what}; compiler output in {log}. Delete {folder} to retry after fixing it."
    (folder / "FAILED").write_text(message)
    return message


def cached_failure(name: str, sources: list[Path], flags: list[str]) -> str | None:
    """The reason an earlier build of exactly these sources and flags failed, or None."""
    return recorded_failure(build_folder(name, sources, flags))


def load_cuda_library(name: str, sources: list[Path], flags: list[str], timeout_s: float = 600) -> ctypes.CDLL:
    """The library of ``sources`` compiled with ``nvcc -shared`` and ``flags`` (built now, or from the cache)."""
    key = (name, tuple(map(str, sources)), tuple(flags))
    if key in _loaded:
        return _loaded[key]
    reason = toolchain_reason(name)
    if reason:
        raise CudaBuildError(reason)
    folder = build_folder(name, sources, flags)
    library = folder / f"lib{name}.so"
    if not library.is_file():
        failure = recorded_failure(folder)
        if failure:
            raise CudaBuildError(failure)
        _compile(name, sources, flags, folder, library, timeout_s)
    _loaded[key] = ctypes.CDLL(str(library))
    return _loaded[key]


def _compile(name: str, sources: list[Path], flags: list[str], folder: Path, library: Path, timeout_s: float):
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as tmp:  # renamed when complete:
        partial = Path(tmp.name)                                                         # processes may race
    command = [nvcc_path(), "-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", *flags, "-o", str(partial),
               *map(str, sources)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (subprocess.TimeoutExpired, OSError) as exc:  # not the sources' fault: the next process tries again
        partial.unlink(missing_ok=True)
        raise CudaBuildError(f"{name}: nvcc did not run to the end ({exc}); it is tried again next time") from exc
    if done.returncode != 0:  # the compiler rejected the sources: remembered, not retried
        partial.unlink(missing_ok=True)
        raise CudaBuildError(record_failure(folder, f"{name}: compiling its CUDA kernels failed",
                                            " ".join(command) + "\n" + done.stdout + done.stderr))
    os.replace(partial, library)
