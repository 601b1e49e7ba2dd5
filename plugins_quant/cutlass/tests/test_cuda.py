"""On an sm_90 GPU: compile the extension, then the CUTLASS kernel against the torch twin on random inputs."""
import pytest
import torch

from nanocore_conformance.linear import build_layer, copy_weight_loader
from nanocore_cutlass import CutlassFp8LinearMethod, build
from nanocore_cutlass.twin import fp8_linear_twin, quantize_activations

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def extension():
    reason = CutlassFp8LinearMethod.supports(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    return build.load_extension()


def _layer(n, k, dtype, options=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) * k ** -0.5
    CutlassFp8LinearMethod.name = CutlassFp8LinearMethod.name or "cutlass"
    method = CutlassFp8LinearMethod(options)
    return method, build_layer(method, weight, [n], dtype, "cuda")


def _rel_err(got, expected):
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 16, 256, 4096])
def test_kernel_matches_twin(extension, m, dtype):
    method, layer = _layer(1024, 2048, dtype, seed=m)
    assert method._extension is extension
    x = torch.randn(m, 2048, device="cuda", dtype=dtype) * torch.rand(m, 1, device="cuda", dtype=dtype).add(0.1)
    xq, x_scale = extension.quantize_fp8_rows(x, 2048, None)
    xq_twin, x_scale_twin = quantize_activations(x)
    # the kernel divides amax / 448 exactly; torch's tensor / scalar on CUDA multiplies by the reciprocal: the
    # scales may differ in the last bit (H200: 54% of rows by 1 ulp), moving values that sit on a rounding edge
    torch.testing.assert_close(x_scale, x_scale_twin, rtol=2.5e-7, atol=0)
    assert (xq.view(torch.uint8) != xq_twin.view(torch.uint8)).float().mean() < 2e-2
    got = method.apply(layer, x)
    twin = fp8_linear_twin(x.float(), layer.weight, layer.weight_scale)
    assert got.dtype == dtype and got.shape == (m, 1024)
    assert _rel_err(got, twin) < 2e-2  # FP8 fast accumulation: worst 1.18e-2 on the 7B shapes (gpu_check)


def test_unaligned_shapes_are_padded(extension):
    method, layer = _layer(30, 100, torch.bfloat16)
    assert layer.weight.shape == (32, 112)  # padded once for TMA's 16-byte rows
    x = torch.randn(5, 100, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(30, device="cuda", dtype=torch.bfloat16)
    twin = fp8_linear_twin(x.float(), layer.weight[:30, :100], layer.weight_scale[:30]) + bias.float()
    assert _rel_err(method.apply(layer, x, bias), twin) < 1e-2


def test_static_input_scale(extension):
    n, k = 256, 512
    w, x = torch.randn(n, k) * k ** -0.5, torch.randn(64, k)
    method = CutlassFp8LinearMethod({"activation_scheme": "static"})
    layer = torch.nn.Module()
    with torch.device("cuda"):
        method.create_weights(layer, k, [n], k, n, torch.bfloat16, copy_weight_loader)
    tensors, config = method.quantize({"weight": w}, {"": x * 0.5})  # calibrated on half the range: large values clamp
    assert config["activation_scheme"] == "static"
    for name, tensor in tensors.items():
        getattr(layer, name).weight_loader(getattr(layer, name), tensor.cuda())
    method.process_weights_after_loading(layer)
    xb = x.to("cuda", torch.bfloat16)
    twin = fp8_linear_twin(xb.float(), layer.weight, layer.weight_scale, layer.input_scale)
    assert _rel_err(method.apply(layer, xb), twin) < 1e-2


def test_cuda_graph_capture(extension):
    method, layer = _layer(512, 1024, torch.bfloat16)
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    eager = method.apply(layer, x)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        method.apply(layer, x)  # warm-up off the default stream, as capture requires
        with torch.cuda.graph(graph):
            captured = method.apply(layer, x)
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(x * 2)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured.float(), 2 * eager.float(), rtol=2e-2, atol=2e-2 * eager.float().abs().max().item())
