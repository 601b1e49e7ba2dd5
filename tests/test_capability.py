"""toolkit.capability: what a method's ``kernel`` option means on a device, device facts cached per device."""
import pytest
import torch

from nanocore.toolkit.capability import cuda_capability, cuda_capability_reason, kernel_uses_triton


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_cpu_never_runs_triton(kernel):
    assert kernel_uses_triton(kernel, torch.device("cpu"), "m") is False


@pytest.mark.parametrize("kernel,required", [("triton", ("triton",)), ("cuda", ("triton", "cuda"))])
def test_a_required_kernel_that_cannot_run_is_a_clear_error(kernel, required):
    with pytest.raises(RuntimeError, match=f"m: kernel='{kernel}' needs a CUDA GPU with Triton; use kernel='auto'"):
        kernel_uses_triton(kernel, torch.device("cpu"), "m", required=required)


def test_capability_is_looked_up_once_per_device(monkeypatch):
    calls = []
    cuda_capability.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: calls.append(device) or (9, 0))
    try:
        for _ in range(3):
            assert cuda_capability_reason(torch.device("cuda:0"), (8, 9), "m") is None
        assert "needs CUDA capability >= 10.0, this GPU has 9.0" in cuda_capability_reason(
            torch.device("cuda:0"), (10, 0), "m")
        assert calls == [torch.device("cuda:0")]
    finally:
        cuda_capability.cache_clear()
