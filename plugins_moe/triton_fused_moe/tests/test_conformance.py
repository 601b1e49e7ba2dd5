"""The shared MoE-executor suite for ``triton_fused_moe``: on the GPU, and its kernels interpreted on CPU."""
import pytest
import torch

from nanocore_conformance import MoEExecutorConformance


class TestTritonFusedMoE(MoEExecutorConformance):
    backend = "triton_fused_moe"


class TestTritonFusedMoEInterpreted(MoEExecutorConformance):
    """The same checks with the Triton kernels run by the Triton interpreter on CPU (fp32)."""

    backend = "triton_fused_moe"

    @pytest.fixture
    def backend_options(self):
        return {"impl": "triton"}

    @pytest.fixture
    def device(self):
        return torch.device("cpu")
