"""toolkit.cuda_library: nvcc builds a cached ctypes library; a failed build is remembered and reported, not retried."""
import ctypes
from pathlib import Path

import pytest

from nanocore.toolkit import cuda_library
from nanocore.toolkit.cuda_library import CudaBuildError, cached_failure, load_cuda_library, nvcc_path

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc (the CUDA toolkit)")
GOOD = 'extern "C" int nanocore_add(int a, int b) { return a + b; }\n__global__ void unused(int* p) { *p = 1; }\n'


@needs_nvcc
def test_builds_once_then_loads_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "add.cu"
    source.write_text(GOOD)
    lib = load_cuda_library("nanocore_test_add", [source], [])
    lib.nanocore_add.restype = ctypes.c_int
    assert lib.nanocore_add(2, 3) == 5
    built = list((tmp_path / "cache" / "cuda").glob("nanocore_test_add-*/libnanocore_test_add.so"))
    assert len(built) == 1
    cuda_library._loaded.clear()  # a new process: the library comes from the cache, nvcc is not run
    monkeypatch.setattr(cuda_library, "_compile", lambda *a, **k: pytest.fail("recompiled a cached library"))
    assert load_cuda_library("nanocore_test_add", [source], []).nanocore_add(1, 1) == 2


@needs_nvcc
def test_a_failed_build_is_reported_with_its_log_and_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "broken.cu"
    source.write_text('extern "C" int f() { return undefined_name; }\n')
    with pytest.raises(CudaBuildError, match="build.log"):
        load_cuda_library("nanocore_test_broken", [source], [])
    assert "failed" in cached_failure("nanocore_test_broken", [source], [])
    log = next((tmp_path / "cache" / "cuda").glob("nanocore_test_broken-*/build.log")).read_text()
    assert "undefined_name" in log
    monkeypatch.setattr(cuda_library, "_compile", lambda *a, **k: pytest.fail("retried a failed build"))
    with pytest.raises(CudaBuildError, match="Delete"):
        load_cuda_library("nanocore_test_broken", [source], [])
    source.write_text(GOOD)  # fixed sources get a new key: no stale failure
    assert cached_failure("nanocore_test_broken", [source], []) is None


def test_without_nvcc_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_library, "nvcc_path", lambda: None)
    with pytest.raises(CudaBuildError, match="CUDA_HOME"):
        load_cuda_library("nanocore_test_none", [Path(__file__)], [])
    assert cuda_library.arch_flags((9, 0)) == ["-gencode=arch=compute_90,code=sm_90"]


def test_an_interrupted_build_is_not_remembered_as_failed(tmp_path, monkeypatch):
    import subprocess
    import sys
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda_library, "nvcc_path", lambda: sys.executable)  # any existing file: never run

    def timeout(*args, **kwargs):
        raise subprocess.TimeoutExpired("nvcc", 1)
    monkeypatch.setattr(subprocess, "run", timeout)
    source = tmp_path / "slow.cu"
    source.write_text(GOOD)
    with pytest.raises(CudaBuildError, match="tried again"):
        load_cuda_library("nanocore_test_slow", [source], [])
    assert cached_failure("nanocore_test_slow", [source], []) is None
