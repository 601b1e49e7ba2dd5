"""fp8 experts (``fp8_channel``): the Triton kernels (interpreted on CPU) against the torch twin, the twin against
``eager`` on the dequantized weights, and what the executor declares."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nanocore.toolkit.moe_weights import dequantize_fp8_experts
from nanocore.toolkit.reference import EagerMoEExecutor
from nanocore_triton_fused_moe import TritonFusedMoEExecutor
from nanocore_triton_fused_moe.reference import fused_moe_torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from fp8_cases import fp8_inputs  # noqa: E402


@pytest.mark.parametrize("m,e,k,h,i,drop,dtype", [
    (1, 8, 2, 64, 32, 0.0, torch.float32),     # decode: one token
    (37, 6, 3, 80, 24, 0.3, torch.float32),    # sizes that are not multiples of the tiles, dropped slots
    (130, 5, 2, 40, 72, 0.0, torch.float16),   # several blocks per expert, partial K and N tiles
])
def test_interpreted_kernels_match_the_torch_twin_with_fp8_experts(m, e, k, h, i, drop, dtype):
    args, scales = fp8_inputs(m, e, k, h, i, dtype, drop, seed=m)
    executor = TritonFusedMoEExecutor({"impl": "triton"})
    out = executor.apply(*args, **scales)
    block_m = executor.configs.pick(m, e, i, k, dtype, torch.device("cpu"))["BLOCK_M"]
    twin = fused_moe_torch(*args, block_m=block_m, **scales)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, twin, atol=tol, rtol=tol)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_fp8_experts_match_eager_on_the_dequantized_weights(impl):
    args, scales = fp8_inputs(23, 7, 2, 48, 40, drop=0.2, seed=5)
    out = TritonFusedMoEExecutor({"impl": impl}).apply(*args, **scales)
    d13, d2 = dequantize_fp8_experts(args[3], args[4], scales["w13_scale"], scales["w2_scale"])
    expected = EagerMoEExecutor().apply(*args[:3], d13, d2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    ignored = TritonFusedMoEExecutor({"impl": impl}).apply(*args, w13_scale=torch.ones_like(scales["w13_scale"]),
                                                             w2_scale=torch.ones_like(scales["w2_scale"]))
    assert not torch.allclose(ignored, expected, atol=1e-2), "the scales must matter"


def test_fp8_without_scales_or_with_bad_scales_is_a_clear_error():
    (x, w, ids, q13, q2), scales = fp8_inputs(3, 2, 1, 16, 8)
    executor = TritonFusedMoEExecutor({"impl": "torch"})
    with pytest.raises(ValueError, match="need their scales"):
        executor.apply(x, w, ids, q13, q2)
    with pytest.raises(ValueError, match="one per output row"):
        executor.apply(x, w, ids, q13, q2, w13_scale=scales["w13_scale"][:, :4], w2_scale=scales["w2_scale"])
    with pytest.raises(ValueError, match="float32"):
        executor.apply(x, w, ids, q13, q2, w13_scale=scales["w13_scale"].half(), w2_scale=scales["w2_scale"])
    with pytest.raises(ValueError, match="come with"):
        executor.apply(x, w, ids, q13.float(), q2.float(), **scales)


def test_declares_fp8_channel_and_its_device_needs():
    assert "fp8_channel" in TritonFusedMoEExecutor.weight_formats
    executor = TritonFusedMoEExecutor()
    assert executor.supports_weight_format("fp8_channel", torch.device("cpu")) is None  # the torch twin widens
    assert "unknown" in executor.supports_weight_format("int4_group", torch.device("cpu"))
    if not torch.cuda.is_available():
        assert "CUDA" in executor.supports_weight_format("fp8_channel", torch.device("cuda"))
    assert TritonFusedMoEExecutor({"impl": "torch"}).supports_weight_format("fp8_channel",
                                                                            torch.device("cuda")) is None


def test_fp8_experts_have_their_own_tuned_table_and_fall_back_to_the_float_one(tmp_path):
    import json

    from nanocore_triton_fused_moe.configs import ConfigTable, config_file_name, triton_version

    tile = dict(BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2)
    float_name = config_file_name(8, 32, torch.float32, "cpu", triton_version())
    (tmp_path / float_name).write_text(json.dumps({"1": dict(BLOCK_M=16, **tile)}))
    cpu = torch.device("cpu")
    assert ConfigTable(str(tmp_path)).pick(1, 8, 32, 2, torch.float32, cpu, "fp8_channel")["BLOCK_M"] == 16
    fp8_name = config_file_name(8, 32, torch.float32, "cpu", triton_version(), "fp8_channel")
    assert "weights=fp8_channel" in fp8_name and fp8_name != float_name
    (tmp_path / fp8_name).write_text(json.dumps({"1": dict(BLOCK_M=32, **tile)}))
    table = ConfigTable(str(tmp_path))
    assert table.pick(1, 8, 32, 2, torch.float32, cpu, "fp8_channel")["BLOCK_M"] == 32
    assert table.pick(1, 8, 32, 2, torch.float32, cpu)["BLOCK_M"] == 16
    args, scales = fp8_inputs(9, 8, 2, 16, 32, seed=3)
    out = TritonFusedMoEExecutor({"impl": "triton", "config_dir": str(tmp_path)}).apply(*args, **scales)
    torch.testing.assert_close(out, fused_moe_torch(*args, block_m=32, **scales), atol=1e-5, rtol=1e-5)
