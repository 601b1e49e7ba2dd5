"""Qwen2-MoE's shared expert on a side CUDA stream: same numbers as the sequential block, on CPU and GPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore.distributed import ParallelContext
from nanocore.layers import moe as moe_layer
from nanocore.layers.attention import AttentionMetadata
from nanocore.layers.moe import StreamOverlap
from nanocore.loader.dummy import init_dummy_weights
from nanocore.models import ModelBuildContext, build_model
from nanocore.models.decoder import DecoderOptions
from nanocore.models.qwen2_moe import SparseMoeBlock, shared_expert_overlap

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def tiny_config(hidden=64, experts=8, top_k=2, inter=32, shared=48, layers=2):
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(hidden_size=hidden, intermediate_size=96, moe_intermediate_size=inter, num_experts=experts,
                          num_experts_per_tok=top_k, shared_expert_intermediate_size=shared, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=128, norm_topk_prob=False,
                          architectures=["Qwen2MoeForCausalLM"])


def make_build(device="cpu", dtype=torch.float32, executor=None, tp_size=1, **extra) -> ModelBuildContext:
    return ModelBuildContext(dtype=dtype, device=torch.device(device), parallel=ParallelContext(tp_size=tp_size),
                             linear_method_factory=lambda prefix: UnquantizedLinearMethod(),
                             moe_executor=executor or EagerMoEExecutor(), **extra)


def make_block(cfg, build, seed=0) -> SparseMoeBlock:
    with torch.device(build.device):
        block = SparseMoeBlock(cfg, build, DecoderOptions(), "model.layers.0.mlp")
    init_dummy_weights(block, seed=seed, std=0.2)  # large enough that routing differs between tokens
    return block.eval()


def reference_block(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """Token by token from the weights: sum_k p_k expert_k(x) + sigmoid(g . x) * shared(x)."""
    w13, w2, inter = block.experts.w13, block.experts.w2, block.experts.w2.shape[2]
    gate_up, down = block.shared_expert.gate_up_proj.weight, block.shared_expert.down_proj.weight
    out = torch.zeros_like(x)
    for m in range(x.shape[0]):
        weights, ids = torch.softmax(block.gate.weight @ x[m], -1).topk(block.experts.top_k)
        for w, e in zip(weights.tolist(), ids.tolist()):
            h = w13[e] @ x[m]
            out[m] += w * (w2[e] @ (F.silu(h[:inter]) * h[inter:]))
        s = gate_up @ x[m]
        half = s.shape[0] // 2
        out[m] += torch.sigmoid(block.shared_expert_gate.weight @ x[m]) * (down @ (F.silu(s[:half]) * s[half:]))
    return out


def test_sequential_block_equals_the_reference_on_cpu():
    block = make_block(tiny_config(), make_build())
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        on = block(x)
        block.overlap.enabled = False
        off = block(x)
        expected = reference_block(block, x)
    assert torch.equal(on, off)  # CPU: "on" is sequential too
    torch.testing.assert_close(off, expected, atol=1e-5, rtol=1e-5)
    assert not block.overlap._side_streams, "no CUDA stream may be taken on CPU"


def test_cpu_runs_main_then_side_without_streams():
    calls = []
    overlap = StreamOverlap(enabled=True)
    main, side = overlap.run(torch.device("cpu"), lambda: calls.append("main") or torch.ones(1),
                             lambda: calls.append("side") or torch.zeros(1))
    assert calls == ["main", "side"] and main.item() == 1 and side.item() == 0
    assert overlap.active(torch.device("cuda")) and not overlap.active(torch.device("cpu"))
    assert not StreamOverlap(enabled=False).active(torch.device("cuda"))


def test_engine_option_module_default_and_tp_choose_the_overlap(monkeypatch):
    assert shared_expert_overlap(make_build()).enabled is True
    assert shared_expert_overlap(make_build(moe_shared_expert_overlap=False)).enabled is False
    assert shared_expert_overlap(make_build(tp_size=2)).enabled is False  # TP stays sequential
    monkeypatch.setattr(moe_layer, "SHARED_EXPERT_OVERLAP", False)
    assert shared_expert_overlap(make_build()).enabled is False
    assert shared_expert_overlap(make_build(moe_shared_expert_overlap=True)).enabled is True


def test_model_layers_share_one_overlap_and_logits_do_not_change():
    model = build_model(tiny_config(layers=3), make_build(moe_shared_expert_overlap=True))
    init_dummy_weights(model, seed=0, std=0.2)
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 3 and all(b.overlap is model.shared_expert_overlap for b in blocks)
    tokens = torch.randint(0, 128, (11,), generator=torch.Generator().manual_seed(0))
    positions, meta = torch.arange(11), AttentionMetadata.for_prefill([11])
    with torch.no_grad():
        on = model(tokens, positions, meta)
        model.shared_expert_overlap.enabled = False
        off = model(tokens, positions, meta)
    assert torch.equal(on, off)


def gpu_executors() -> dict:
    executors = {"eager": EagerMoEExecutor()}
    try:
        from nanocore_triton_fused_moe import TritonFusedMoEExecutor
    except ImportError:
        return executors
    executors["triton_fused_moe"] = TritonFusedMoEExecutor()
    return executors


def gpu_block(executor, seed=0) -> SparseMoeBlock:
    cfg = tiny_config(hidden=512, experts=16, top_k=4, inter=256, shared=1024)
    return make_block(cfg, make_build("cuda", torch.bfloat16, executor), seed=seed)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("executor_name", ["eager", "triton_fused_moe"])
@pytest.mark.parametrize("num_tokens", [1, 16, 100])
def test_overlap_equals_sequential_on_gpu(executor_name, num_tokens):
    executors = gpu_executors()
    if executor_name not in executors:
        pytest.skip("nanocore-triton-fused-moe is not installed")
    block = gpu_block(executors[executor_name])
    x = torch.randn(num_tokens, 512, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        block.overlap.enabled = False
        off = block(x)
        block.overlap.enabled = True
        on = block(x)
    torch.cuda.synchronize()
    assert block.overlap._side_streams, "the overlap path did not run"
    assert torch.equal(on, off) and off.isfinite().all() and off.abs().amax() > 0


def capture(block, x, enabled: bool):
    """Warm up on a side stream (Triton compiles, side stream taken), then capture one forward."""
    block.overlap.enabled = enabled
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        block(x)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block(x)
    return graph, out


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("num_tokens", [1, 16])
def test_overlap_equals_sequential_under_graph_replay(num_tokens):
    executors = gpu_executors()
    if "triton_fused_moe" not in executors:
        pytest.skip("nanocore-triton-fused-moe is not installed (the eager executor cannot be captured)")
    block = gpu_block(executors["triton_fused_moe"])
    x = torch.zeros(num_tokens, 512, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        graph_on, out_on = capture(block, x, enabled=True)
        graph_off, out_off = capture(block, x, enabled=False)
        for seed in range(3):  # new inputs, hence new routing, in the captured buffers
            x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x))
            graph_on.replay()
            graph_off.replay()
            eager = block(x)
            torch.cuda.synchronize()
            assert torch.equal(out_on, out_off), f"seed {seed}: overlapped graph differs from the sequential one"
            assert torch.equal(out_on, eager), f"seed {seed}: graph replay differs from the eager forward"


def test_engine_config_field_reaches_the_model_build(monkeypatch):
    from nanocore.config import EngineConfig
    from nanocore.loader import model_loader

    seen = {}

    def capture(hf_config, build):
        seen["overlap"] = build.moe_shared_expert_overlap
        raise RuntimeError("captured")
    monkeypatch.setattr(model_loader, "build_model", capture)
    for value in (False, True):
        with pytest.raises(RuntimeError, match="captured"):
            model_loader.load_model(EngineConfig(model="dummy:tiny-qwen2", device="cpu", moe_shared_expert_overlap=value),
                                    "cpu")
        assert seen["overlap"] is value
