"""supports() and the build: every reason the kernel cannot run is named, nothing falls back silently."""
import importlib

import pytest
import torch

from nanocore.toolkit.capability import cuda_capability
from nanocore_cutlass import CutlassFp8LinearMethod, build

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _fresh_device_facts():
    """The tests pretend GPUs by patching torch.cuda; toolkit.capability caches what it looked up per device."""
    cuda_capability.cache_clear()
    yield
    cuda_capability.cache_clear()


def _fake_cutlass_tree(root):
    """The two header folders the build needs, as the nvidia-cutlass wheel lays them out."""
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cutlass" / "cutlass.h").write_text("// fake\n")
    (root / "tools" / "util" / "include" / "cutlass" / "util").mkdir(parents=True)
    (root / "tools" / "util" / "include" / "cutlass" / "util" / "packed_stride.hpp").write_text("// fake\n")
    return root


@pytest.fixture
def hopper(monkeypatch, tmp_path):
    """A pretend H100: CUDA available, capability 9.0, nvcc and ninja found, headers in a fake tree, empty cache."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(build, "nvcc_path", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("NANOCORE_CUTLASS_DIR", str(_fake_cutlass_tree(tmp_path / "cutlass")))
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_loaded", {})
    return tmp_path


def test_cpu_runs_the_twin_and_other_devices_say_why():
    assert CutlassFp8LinearMethod.supports(torch.device("cpu")) is None
    assert "not meta" in CutlassFp8LinearMethod.supports(torch.device("meta"))


def test_no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs CUDA" in CutlassFp8LinearMethod.supports(CUDA)


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_only_sm90(hopper, monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    reason = CutlassFp8LinearMethod.supports(CUDA)
    assert "sm_90a" in reason and f"{capability[0]}.{capability[1]}" in reason and "fp8_w8a8" in reason


def test_hopper_with_everything_is_supported(hopper):
    assert CutlassFp8LinearMethod.supports(CUDA) is None


def test_nvcc_missing(hopper, monkeypatch):
    monkeypatch.setattr(build, "nvcc_path", lambda: None)
    assert "needs nvcc" in CutlassFp8LinearMethod.supports(CUDA)


def test_ninja_missing(hopper, monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert "pip install ninja" in CutlassFp8LinearMethod.supports(CUDA)


def test_headers_missing_says_pip_install(hopper, monkeypatch):
    monkeypatch.delenv("NANOCORE_CUTLASS_DIR")
    monkeypatch.setattr(build, "_wheel_roots", lambda: [])
    assert "pip install nvidia-cutlass" in CutlassFp8LinearMethod.supports(CUDA)


def test_bad_override_names_the_folder(hopper, monkeypatch, tmp_path):
    monkeypatch.setenv("NANOCORE_CUTLASS_DIR", str(tmp_path / "nowhere"))
    reason = CutlassFp8LinearMethod.supports(CUDA)
    assert "NANOCORE_CUTLASS_DIR" in reason and "nowhere" in reason


def test_override_may_name_the_include_folder(hopper):
    root = hopper / "cutlass"
    dirs, source = build.cutlass_include_dirs()
    assert dirs == [root / "include", root / "tools" / "util" / "include"] and "NANOCORE_CUTLASS_DIR" in source


def test_wheel_headers_found_without_importing_the_package(monkeypatch, tmp_path):
    site = tmp_path / "site"
    package = site / "cutlass_library"
    _fake_cutlass_tree(package / "source")
    # the real package imports cuda-python, which the GPU machine's --no-deps install does not have
    (package / "__init__.py").write_text("raise ImportError('cuda-python is not installed')\n")
    monkeypatch.delenv("NANOCORE_CUTLASS_DIR", raising=False)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    dirs, source = build.cutlass_include_dirs()
    assert dirs == [package / "source" / "include", package / "source" / "tools" / "util" / "include"]
    assert str(package) in source


def test_cache_dir_follows_nanocore_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOCORE_CACHE_DIR", str(tmp_path))
    assert build.cache_root() == tmp_path / "cutlass"
    monkeypatch.delenv("NANOCORE_CACHE_DIR")
    assert build.cache_root().parts[-3:] == (".cache", "nanocore", "cutlass")


def test_build_key_changes_with_the_headers(hopper, tmp_path):
    dirs, _ = build.cutlass_include_dirs()
    assert build.build_key(dirs) != build.build_key([tmp_path / "other"])
    assert build.build_dir() == hopper / "cache" / "cutlass" / build.build_key(dirs)


def test_build_key_changes_with_the_cutlass_version_and_the_compiler(hopper, tmp_path, monkeypatch):
    headers = tmp_path / "include"
    (headers / "cutlass").mkdir(parents=True)
    (headers / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n")
    before = build.build_key([headers])
    (headers / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 5\n")
    assert build.build_key([headers]) != before  # same folder, upgraded headers: a failed build is retried
    other_nvcc = tmp_path / "nvcc"
    other_nvcc.write_text("a different compiler")
    after_upgrade = build.build_key([headers])
    monkeypatch.setattr(build, "nvcc_path", lambda: str(other_nvcc))
    assert build.build_key([headers]) != after_upgrade


def test_compile_failure_is_cached_with_its_log(hopper, monkeypatch):
    calls = []

    def failing_load(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("Error building extension: fp8_gemm_sm90_bf16.cu(12): error: boom")

    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setattr(cpp_extension, "load", failing_load)
    with pytest.raises(build.CutlassBuildError, match="compiling the CUTLASS kernel failed") as info:
        build.load_extension()
    assert "-gencode=arch=compute_90a,code=sm_90a" in calls[0]["extra_cuda_cflags"]
    log = build.build_dir() / "build.log"
    assert str(log) in str(info.value) and "error: boom" in log.read_text()
    reason = CutlassFp8LinearMethod.supports(CUDA)
    assert "build.log" in reason and "Delete" in reason
    with pytest.raises(build.CutlassBuildError):
        build.load_extension()
    assert len(calls) == 1, "a cached failure must not compile again"


def test_explicit_kernel_on_cpu_is_an_error_not_a_fallback():
    from nanocore_conformance.linear import build_layer

    method = CutlassFp8LinearMethod({"kernel": "cutlass"})
    CutlassFp8LinearMethod.name = CutlassFp8LinearMethod.name or "cutlass"
    with pytest.raises(RuntimeError, match="needs an sm_90 GPU"):
        build_layer(method, torch.randn(8, 16), [8], torch.float32, "cpu")
