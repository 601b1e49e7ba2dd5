"""The MoE layer: router, per-expert weight loading, local and expert-parallel prepare/finalize."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.distributed import ParallelContext
from nanocore.layers.moe import FusedMoE, Router, match_expert_weight, select_experts

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from spawn_helpers import run_two_rank_script  # noqa: E402


def random_experts(num_experts, hidden, inter, seed=0):
    """Per-expert checkpoint tensors {(expert, shard): tensor}, as a HF checkpoint stores them."""
    g = torch.Generator().manual_seed(seed)
    return {(e, s): torch.randn(*(shape), generator=g) * 0.2
            for e in range(num_experts)
            for s, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter)))}


def load_experts(layer: FusedMoE, tensors) -> None:
    for (expert, shard), tensor in tensors.items():
        param = layer.w2 if shard == "w2" else layer.w13
        param.weight_loader(param, tensor, expert, shard)


def dense_reference(x, router_logits, tensors, top_k, renormalize):
    """Token by token: ``sum_k p_k * down(silu(gate x) * up x)`` over the top-k experts."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    out = torch.zeros_like(x)
    for m in range(x.shape[0]):
        weights, ids = probs[m].topk(top_k)
        if renormalize:
            weights = weights / weights.sum()
        for w, e in zip(weights.tolist(), ids.tolist()):
            h = F.silu(tensors[e, "w1"] @ x[m]) * (tensors[e, "w3"] @ x[m])
            out[m] += w * (tensors[e, "w2"] @ h)
    return out


@pytest.mark.parametrize("renormalize", [False, True])
def test_select_experts_matches_softmax_topk(renormalize):
    logits = torch.randn(7, 6)
    weights, ids = select_experts(logits, 3, renormalize)
    probs = logits.softmax(-1)
    assert torch.equal(ids, probs.topk(3).indices)
    expected = probs.topk(3).values
    expected = expected / expected.sum(-1, keepdim=True) if renormalize else expected
    torch.testing.assert_close(weights, expected)
    assert weights.dtype == torch.float32


@pytest.mark.parametrize("num_tokens,top_k,renormalize", [(1, 2, False), (9, 2, True), (17, 4, False)])
def test_layer_equals_dense_reference(num_tokens, top_k, renormalize):
    torch.manual_seed(num_tokens)
    E, H, I = 6, 16, 12
    tensors = random_experts(E, H, I)
    layer = FusedMoE(E, top_k, H, I, executor=EagerMoEExecutor(), renormalize=renormalize)
    load_experts(layer, tensors)
    x, logits = torch.randn(num_tokens, H), torch.randn(num_tokens, E)
    torch.testing.assert_close(layer(x, logits), dense_reference(x, logits, tensors, top_k, renormalize),
                               atol=1e-5, rtol=1e-5)


def test_router_is_a_replicated_linear():
    router = Router(8, 4, torch.float32)
    weight = torch.randn(4, 8)
    router.weight.weight_loader(router.weight, weight)
    x = torch.randn(3, 8)
    torch.testing.assert_close(router(x), x @ weight.t())
    with pytest.raises(ValueError, match="router weight has shape"):
        router.weight.weight_loader(router.weight, torch.randn(5, 8))


def test_match_expert_weight_names():
    assert match_expert_weight("model.layers.0.mlp.experts.12.gate_proj.weight") == ("model.layers.0.mlp.experts.w13", 12, "w1")
    assert match_expert_weight("model.layers.0.mlp.experts.3.down_proj.weight") == ("model.layers.0.mlp.experts.w2", 3, "w2")
    assert match_expert_weight("model.layers.0.mlp.shared_expert.up_proj.weight") is None
    assert match_expert_weight("model.layers.0.mlp.gate.weight") is None


def test_expert_parallel_rank_loads_only_its_experts():
    E, H, I = 4, 8, 6
    tensors = random_experts(E, H, I)
    layer = FusedMoE(E, 2, H, I, executor=EagerMoEExecutor(), parallel=ParallelContext(ep_rank=1, ep_size=2))
    layer.w13.data.fill_(7.0)
    load_experts(layer, tensors)
    assert layer.w13.shape == (2, 2 * I, H)
    torch.testing.assert_close(layer.w13.data[0, :I], tensors[2, "w1"])
    torch.testing.assert_close(layer.w13.data[1, I:], tensors[3, "w3"])
    torch.testing.assert_close(layer.w2.data[1], tensors[3, "w2"])


def test_tensor_parallel_rank_loads_its_intermediate_slice():
    E, H, I = 2, 8, 6
    tensors = random_experts(E, H, I)
    layer = FusedMoE(E, 1, H, I, executor=EagerMoEExecutor(), parallel=ParallelContext(tp_rank=1, tp_size=2))
    load_experts(layer, tensors)
    torch.testing.assert_close(layer.w13.data[1, :3], tensors[1, "w1"][3:])
    torch.testing.assert_close(layer.w13.data[1, 3:], tensors[1, "w3"][3:])
    torch.testing.assert_close(layer.w2.data[0], tensors[0, "w2"][:, 3:])


def test_bad_checkpoint_and_config_errors_are_clear():
    layer = FusedMoE(4, 2, 8, 6, executor=EagerMoEExecutor())
    with pytest.raises(ValueError, match="expected \\(6, 8\\).*moe_intermediate_size"):
        layer.w13.weight_loader(layer.w13, torch.randn(5, 8), 0, "w1")
    with pytest.raises(ValueError, match="num_experts=4"):
        layer.w13.weight_loader(layer.w13, torch.randn(6, 8), 9, "w1")
    with pytest.raises(ValueError, match="unknown expert shard"):
        layer.w13.weight_loader(layer.w13, torch.randn(6, 8), 0, "gate")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        FusedMoE(4, 5, 8, 6, executor=EagerMoEExecutor())
    with pytest.raises(ValueError, match="num_experts"):
        FusedMoE(5, 2, 8, 6, executor=EagerMoEExecutor(), parallel=ParallelContext(ep_rank=0, ep_size=2))


@pytest.mark.slow
def test_expert_parallel_two_ranks_equals_one(tmp_path):
    """EP=2 over gloo (two spawned processes, different token counts each) equals EP=1."""
    run_two_rank_script(Path(__file__).with_name("moe_ep_worker.py"), tmp_path)


def test_tune_command_shape_per_rank_and_errors():
    from nanocore.cli.main import main
    from nanocore.cli.tune_cmd import expert_shape
    from nanocore.loader.presets import preset_config

    qwen15 = preset_config("Qwen1.5-MoE-A2.7B")
    assert expert_shape(qwen15, tp=2, ep=1) == dict(num_experts=60, intermediate=704, hidden=2048, top_k=4)
    assert expert_shape(qwen15, tp=1, ep=4) == dict(num_experts=15, intermediate=1408, hidden=2048, top_k=4)
    with pytest.raises(ValueError, match="does not split over 8 ranks"):
        expert_shape(qwen15, tp=1, ep=8)
    assert main(["tune", "moe", "--model", "dummy:Qwen3-0.6B"]) == 1  # a dense model: a message, no traceback


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_bench_moe_says_it_needs_a_gpu():
    from nanocore.bench.moe import main

    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        main(["--tokens", "1"])
