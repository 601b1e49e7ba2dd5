"""GPU checks for fp8 experts (``fp8_channel``): the kernels against eager on the dequantized weights, CUDA-graph
capture, no host synchronisation."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nanocore.toolkit.moe_weights import dequantize_fp8_experts
from nanocore.toolkit.reference import EagerMoEExecutor
from nanocore_triton_fused_moe import TritonFusedMoEExecutor

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from fp8_cases import fp8_inputs  # noqa: E402

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("fp8 experts need CUDA capability >= 8.9", allow_module_level=True)


def inputs(m, e, k, h, i, dtype, seed=0, drop=0.0):
    args, scales = fp8_inputs(m, e, k, h, i, dtype, drop, seed, softmax_weights=True)
    return tuple(t.cuda() for t in args), {name: s.cuda() for name, s in scales.items()}


def oracle(args, scales):
    d13, d2 = dequantize_fp8_experts(args[3], args[4], scales["w13_scale"], scales["w2_scale"])
    return EagerMoEExecutor().apply(args[0].float(), args[1], args[2], d13, d2)


@pytest.mark.parametrize("m,e,k,h,i,dtype", [
    (1, 8, 2, 256, 128, torch.bfloat16), (7, 60, 4, 2048, 1408, torch.bfloat16), (256, 8, 1, 1024, 512, torch.bfloat16),
    (300, 128, 8, 512, 768, torch.bfloat16), (2048, 16, 2, 256, 256, torch.bfloat16),
    (33, 8, 2, 520, 200, torch.bfloat16),  # K and N not multiples of the tiles: masked byte loads
    (33, 8, 2, 512, 256, torch.float16), (33, 8, 2, 512, 256, torch.float32),
])
def test_fp8_kernels_match_eager_on_dequantized_weights(m, e, k, h, i, dtype):
    args, scales = inputs(m, e, k, h, i, dtype, seed=m, drop=0.1)
    out = TritonFusedMoEExecutor().apply(*args, **scales)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), oracle(args, scales), atol=tol, rtol=tol)


def test_fp8_apply_never_synchronises_with_the_host():
    args, scales = inputs(16, 8, 2, 256, 128, torch.bfloat16)
    executor = TritonFusedMoEExecutor()
    executor.apply(*args, **scales)  # compile outside the check
    torch.cuda.set_sync_debug_mode("error")
    try:
        executor.apply(*args, **scales)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("m", [1, 8])
def test_fp8_cuda_graph_capture_and_replay_with_new_routing(m):
    (x, w, ids, w13, w2), scales = inputs(m, 8, 2, 256, 128, torch.bfloat16)
    executor = TritonFusedMoEExecutor()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        executor.apply(x, w, ids, w13, w2, **scales)  # warm up (compile) off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = executor.apply(x, w, ids, w13, w2, **scales)
    for seed in (1, 2):
        (nx, nw, nids, _, _), _ = inputs(m, 8, 2, 256, 128, torch.bfloat16, seed=seed, drop=0.3)
        x.copy_(nx), w.copy_(nw), ids.copy_(nids)
        graph.replay()
        torch.testing.assert_close(out.float(), oracle((x, w, ids, w13, w2), scales), atol=3e-2, rtol=3e-2)
