"""``triton_fused_moe`` inside a Qwen3-MoE model: same logits as the ``eager`` executor (kernels interpreted)."""
from __future__ import annotations

import torch

from nanocore.distributed import ParallelContext
from nanocore.layers.attention import AttentionMetadata
from nanocore.loader.dummy import init_dummy_weights
from nanocore.models import ModelBuildContext, build_model
from nanocore.toolkit.reference import EagerMoEExecutor, UnquantizedLinearMethod
from nanocore_triton_fused_moe import TritonFusedMoEExecutor


def tiny_qwen3_moe(executor):
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128, num_experts=8,
                         num_experts_per_tok=2, norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"])
    build = ModelBuildContext(dtype=torch.float32, device=torch.device("cpu"), parallel=ParallelContext(),
                              linear_method_factory=lambda prefix: UnquantizedLinearMethod(), moe_executor=executor)
    model = build_model(cfg, build)
    init_dummy_weights(model, seed=0, std=0.2)  # large enough that routing differs between tokens
    return model


def test_model_logits_equal_with_fused_and_eager_executors():
    tokens = torch.randint(0, 128, (19,), generator=torch.Generator().manual_seed(0))
    positions, meta = torch.arange(19), AttentionMetadata.for_prefill([19])
    logits = []
    for executor in (EagerMoEExecutor(), TritonFusedMoEExecutor({"impl": "triton"})):
        model = tiny_qwen3_moe(executor)
        with torch.no_grad():
            logits.append(model.compute_logits(model(tokens, positions, meta)))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)
