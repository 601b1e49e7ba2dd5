"""The mixed-input tensor-core GEMMs (toolkit.gemm_mma, toolkit.gemm_int4), the dequant and scaled_mm paths, and the
kernel plan, against the torch references on random inputs (never zeros); K = 576 is no multiple of 128."""
import os

import pytest
import torch

from nanocore.toolkit.gemm import GemmConfig, weight_only_linear, weight_only_linear_torch
from nanocore.toolkit.gemm_config import weight_only_config
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, METHOD_FORMATS, check_plan, kernel_for, switch_points
from nanocore.toolkit.numerics import awq_dequantize, awq_pack, quantize_fp8_per_row, quantize_int8_per_row

interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton interpreter runs only without CUDA (see conftest.py)")
MMA_CONFIGS = [GemmConfig("mma", 64, 32, 64), GemmConfig("mma", 32, 64, 128, swap_ab=False),
               GemmConfig("mma", 16, 32, 64, fast_widen=False), GemmConfig("dequant")]


def _err(got, expected):
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())


def _awq_reference(x, packed, bias=None):
    w = awq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"].float())
    return torch.nn.functional.linear(x.float(), w.t(), None if bias is None else bias.float())


def _awq_run(x, packed, bias, cfg):
    from nanocore.toolkit.gemm_int4 import awq_dequantize_gpu, awq_mma_linear
    if cfg.kind == "dequant":
        out = x @ awq_dequantize_gpu(**packed, dtype=x.dtype)
        return out if bias is None else out + bias
    y = torch.empty((x.shape[0], packed["scales"].shape[1]), dtype=x.dtype, device=x.device)
    awq_mma_linear(x, **packed, bias=bias, y=y, cfg=cfg)
    return y


@interpreter
@pytest.mark.parametrize("m", [1, 16, 65, 150, 512])
@pytest.mark.parametrize("quantize", [quantize_fp8_per_row, quantize_int8_per_row])
def test_mma_and_dequant_match_torch_reference_in_interpreter(m, quantize):
    torch.manual_seed(m)
    q, scale = quantize(torch.randn(72, 576) * 0.3)
    x, bias = torch.randn(m, 576).half(), torch.randn(72).half()
    expected = weight_only_linear_torch(x.float(), q, scale, bias.float())
    for cfg in MMA_CONFIGS:
        got = weight_only_linear(x, q, scale, bias, cfg)
        assert _err(got, expected) <= 2e-3, (cfg, _err(got, expected))


@interpreter
@pytest.mark.parametrize("m", [1, 16, 65, 150, 512])
@pytest.mark.parametrize("k,group", [(576, 64), (640, 128)])
def test_awq_mma_and_dequant_match_torch_reference_in_interpreter(m, k, group):
    torch.manual_seed(m + k)
    packed = awq_pack(torch.randn(48, k), group)
    x, bias = torch.randn(m, k).half(), torch.randn(48).half()
    expected = _awq_reference(x, packed, bias)
    for cfg in MMA_CONFIGS[:2] + MMA_CONFIGS[3:]:
        assert _err(_awq_run(x, packed, bias, cfg), expected) <= 2e-3, cfg


@pytest.mark.parametrize("fmt", sorted(KERNEL_PLANS))
def test_kernel_plans_are_well_formed_and_switch_where_they_say(fmt):
    plan = KERNEL_PLANS[fmt]
    check_plan(plan)
    for t in switch_points(plan):
        assert kernel_for(plan, t) != kernel_for(plan, t + 1)
    assert weight_only_config(1, 64, 64, fmt).kind in ("gemv", "splitk")


def test_bad_kernel_plans_are_refused():
    for bad in [((32, "splitk"),), ((32, "splitk"), (16, "gemv"), (None, "mma")), ((None, "warp_drive"),)]:
        with pytest.raises(ValueError, match="kernel plan"):
            check_plan(bad)


@pytest.mark.cuda
@pytest.mark.parametrize("quantize", [quantize_fp8_per_row, quantize_int8_per_row])
@pytest.mark.parametrize("m", [33, 65, 150, 512, 1024])
@pytest.mark.parametrize("k", [576, 4096])
def test_mma_bf16_on_cuda(quantize, m, k):
    torch.manual_seed(m + k)
    q, scale = quantize(torch.randn(384, k, device="cuda"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    expected = weight_only_linear_torch(x.float(), q, scale, bias.float())
    configs = [None, GemmConfig("mma", 128, 128, 64, num_warps=8), GemmConfig("mma", 64, 128, 128, swap_ab=False),
               GemmConfig("mma", 128, 128, 64, num_warps=8, fast_widen=False), GemmConfig("dequant")]
    for cfg in configs:
        assert _err(weight_only_linear(x, q, scale, bias, cfg), expected) < 1e-2, cfg
    if q.dtype == torch.float8_e4m3fn:  # fp8 activations per token: fp8_w8a8's numerics
        assert _err(weight_only_linear(x, q, scale, bias, GemmConfig("scaled_mm")), expected) < 0.07


@pytest.mark.cuda
@pytest.mark.parametrize("m", [33, 65, 150, 512, 1024])
@pytest.mark.parametrize("k,group", [(576, 64), (4096, 128)])
def test_awq_mma_bf16_on_cuda(m, k, group):
    torch.manual_seed(m + k)
    packed = {name: t.cuda() for name, t in awq_pack(torch.randn(512, k), group, torch.bfloat16).items()}
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    expected = _awq_reference(x, packed, bias)
    for cfg in [GemmConfig("mma", 128, 128, 64, num_warps=8), GemmConfig("mma", 64, 128, 128, swap_ab=False),
                GemmConfig("mma", 256, 128, 64, num_warps=8, num_stages=3), GemmConfig("dequant")]:
        assert _err(_awq_run(x, packed, bias, cfg), expected) < 1e-2, cfg


@interpreter
@pytest.mark.parametrize("name", sorted(METHOD_FORMATS))
def test_each_side_of_every_kernel_threshold_matches_the_torch_twin(name):
    """Each weight-only method declares its format's plan; at M = t and t + 1 of every switch point the kernel the
    plan picks (run in the interpreter) agrees with the method's torch twin (what ``apply`` runs on CPU)."""
    from nanocore.bench.linear import build_layer
    from nanocore.plugins import get_registry
    try:
        entry = get_registry().get("linear_method", name)
    except Exception as exc:  # the plugin is not installed here
        pytest.skip(f"{name} is not installed: {exc}")
    cls = entry.cls
    assert cls.kernel_plan == KERNEL_PLANS[METHOD_FORMATS[name]]
    assert cls.kernel_thresholds == switch_points(cls.kernel_plan) and cls.kernel_thresholds
    torch.manual_seed(len(name))
    method, layer = build_layer(entry, {}, torch.randn(48, 256) * 0.1, torch.float32)
    for t in cls.kernel_thresholds:
        for m in (t, t + 1):
            x = torch.randn(m, 256)
            expected = method.apply(layer, x)
            if METHOD_FORMATS[name] == "int4_group":
                got = pytest.importorskip("nanocore_awq.kernels").awq_linear_triton(
                    x, layer.qweight, layer.qzeros, layer.scales)
            else:
                got = weight_only_linear(x, layer.weight, layer.weight_scale)
            assert _err(got, expected) <= 1e-3, (name, m, kernel_for(cls.kernel_plan, m))  # awq: fp16 scales
