"""fp8 experts served as fp8 (``fp8_channel``): which layers keep them, loading (EP / TP slices, per-tensor scales,
errors), and the llm-compressor FP8_DYNAMIC Qwen2-MoE checkpoint through ``triton_fused_moe`` (its torch twin on CPU)
against the dequantized path."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.config import EngineConfig
from nanocore.distributed import ParallelContext
from nanocore.layers.attention import AttentionMetadata
from nanocore.layers.moe import FusedMoE, match_expert_weight
from nanocore.loader import load_model
from nanocore.loader.expert_weights import ExpertFormats, fp8_channel_reason
from nanocore.toolkit.checkpoint_formats import parse_quantization_config
from nanocore.toolkit.numerics import quantize_fp8_per_row
from nanocore_triton_fused_moe import TritonFusedMoEExecutor

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from spawn_helpers import run_two_rank_script  # noqa: E402

FP8_DYNAMIC = Path(__file__).parent / "data" / "producers" / "qwen2_moe_fp8_dynamic"
EXPERTS = "model.layers.0.mlp.experts"


def ct_config(strategy="channel", num_bits=8, type_="float", fmt="float-quantized", ignore=(), block=None):
    weights = {"num_bits": num_bits, "type": type_, "strategy": strategy, "symmetric": True,
               "group_size": 128 if strategy == "group" else None}
    if block:
        weights["block_structure"] = block
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "format": fmt}}}


@pytest.mark.parametrize("config, fp8", [
    (ct_config(), True),                                     # llm-compressor FP8_DYNAMIC / FP8 channel-wise
    (ct_config("tensor"), True),                             # per-tensor: one scale spread over the rows
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, True),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, False),
    (ct_config("block", block=[128, 128]), False),
    (ct_config("group", num_bits=4, type_="int", fmt="pack-quantized"), False),
    (ct_config(ignore=["re:.*layers\\.0\\.mlp\\.experts.*"]), False),  # this layer's experts left in float
    (None, False),
])
def test_which_checkpoints_keep_fp8_experts(config, fp8):
    reason = fp8_channel_reason(parse_quantization_config(config), EXPERTS)
    assert (reason is None) == fp8, reason


def test_the_executor_and_the_device_decide_too():
    config = ct_config()
    cpu = torch.device("cpu")
    assert ExpertFormats(config, TritonFusedMoEExecutor(), cpu).format_of(EXPERTS) == "fp8_channel"
    formats = ExpertFormats(config, EagerMoEExecutor(), cpu)
    assert formats.format_of(EXPERTS) == "float" and "EagerMoEExecutor" in formats._float_reasons[EXPERTS]
    assert not formats.keeps_quantized(f"{EXPERTS}.0.gate_proj")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        # the Triton path cannot widen fp8 there: dequantize at load, as before
        assert ExpertFormats(config, TritonFusedMoEExecutor(), torch.device("cuda")).format_of(EXPERTS) == "float"


def fp8_experts(num_experts, hidden, inter, seed=0):
    """Per-expert checkpoint tensors {(expert, shard): (fp8 weight, bf16 scale [N, 1])}, as llm-compressor writes."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for e in range(num_experts):
        for shard, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
            q, scale = quantize_fp8_per_row(torch.randn(*shape, generator=g) * 0.2)
            out[e, shard] = (q, scale.bfloat16())
    return out


def load(layer: FusedMoE, tensors) -> None:
    for (expert, shard), (q, scale) in tensors.items():
        name = "w2" if shard == "w2" else "w13"
        for param, tensor in ((getattr(layer, name), q), (getattr(layer, f"{name}_scale"), scale)):
            param.weight_loader(param, tensor, expert, shard)


def dequantized(tensors, e, shard):
    q, scale = tensors[e, shard]
    return q.float() * scale.float()


def test_fp8_layer_equals_the_float_layer_on_dequantized_weights():
    E, H, I = 5, 24, 20
    tensors = fp8_experts(E, H, I)
    fp8 = FusedMoE(E, 2, H, I, executor=TritonFusedMoEExecutor({"impl": "torch"}), weight_format="fp8_channel")
    ref = FusedMoE(E, 2, H, I, executor=EagerMoEExecutor())
    load(fp8, tensors)
    for (e, shard) in tensors:
        param = ref.w2 if shard == "w2" else ref.w13
        param.weight_loader(param, dequantized(tensors, e, shard), e, shard)
    assert fp8.w13.dtype == torch.float8_e4m3fn and fp8.w13_scale.shape == (E, 2 * I) and fp8.w2_scale.shape == (E, H)
    x, logits = torch.randn(9, H), torch.randn(9, E)
    torch.testing.assert_close(fp8(x, logits), ref(x, logits), atol=1e-5, rtol=1e-5)
    assert "weights=fp8_channel" in fp8.extra_repr()
    assert match_expert_weight(f"{EXPERTS}.3.up_proj.weight_scale") == (f"{EXPERTS}.w13_scale", 3, "w3")


def test_expert_parallel_and_tensor_parallel_ranks_load_their_fp8_slices():
    E, H, I = 4, 8, 6
    tensors = fp8_experts(E, H, I)
    ep = FusedMoE(E, 2, H, I, executor=TritonFusedMoEExecutor(), weight_format="fp8_channel",
                  parallel=ParallelContext(ep_rank=1, ep_size=2))
    load(ep, tensors)
    assert ep.w13.shape == (2, 2 * I, H) and ep.w13_scale.shape == (2, 2 * I)
    assert torch.equal(ep.w13.data[1, I:].view(torch.uint8), tensors[3, "w3"][0].view(torch.uint8))
    torch.testing.assert_close(ep.w13_scale.data[0, :I], tensors[2, "w1"][1].float().flatten())
    torch.testing.assert_close(ep.w2_scale.data[1], tensors[3, "w2"][1].float().flatten())
    tp = FusedMoE(E, 1, H, I, executor=TritonFusedMoEExecutor(), weight_format="fp8_channel",
                  parallel=ParallelContext(tp_rank=1, tp_size=2))
    load(tp, tensors)
    torch.testing.assert_close(tp.w13_scale.data[1, :3], tensors[1, "w1"][1].float().flatten()[3:])
    torch.testing.assert_close(tp.w13_scale.data[1, 3:], tensors[1, "w3"][1].float().flatten()[3:])
    torch.testing.assert_close(tp.w2_scale.data[0], tensors[0, "w2"][1].float().flatten())  # rows whole: H
    assert torch.equal(tp.w2.data[0].view(torch.uint8), tensors[0, "w2"][0][:, 3:].view(torch.uint8))


def test_per_tensor_scales_spread_and_bad_input_errors():
    layer = FusedMoE(2, 1, 8, 6, executor=TritonFusedMoEExecutor(), weight_format="fp8_channel")
    layer.w13_scale.weight_loader(layer.w13_scale, torch.tensor(0.5), 1, "w3")
    assert torch.equal(layer.w13_scale.data[1, 6:], torch.full((6,), 0.5))
    with pytest.raises(ValueError, match="one scale per output row"):
        layer.w13_scale.weight_loader(layer.w13_scale, torch.ones(6, 2), 0, "w1")
    with pytest.raises(ValueError, match="holds fp8 e4m3 experts"):
        layer.w13.weight_loader(layer.w13, torch.randn(6, 8), 0, "w1")
    with pytest.raises(ValueError, match="does not take 'fp8_channel'"):
        FusedMoE(2, 1, 8, 6, executor=EagerMoEExecutor(), weight_format="fp8_channel")
    with pytest.raises(ValueError, match="does not take 'int4'"):
        FusedMoE(2, 1, 8, 6, executor=TritonFusedMoEExecutor(), weight_format="int4")


def producer_logits(executor: str, monkeypatch=None):
    if monkeypatch is not None:  # run triton_fused_moe's torch twin on CPU (supports() refuses CPU for speed's sake)
        monkeypatch.setattr(TritonFusedMoEExecutor, "supports", classmethod(lambda cls, device: None))
    loaded = load_model(EngineConfig(model=str(FP8_DYNAMIC), moe_executor=executor, dtype="float32"), "cpu")
    ids = torch.load(FP8_DYNAMIC / "reference_logits.pt")["input_ids"]
    with torch.no_grad():
        hidden = loaded.model(ids, torch.arange(len(ids)), AttentionMetadata.for_prefill([len(ids)]))
        return loaded, loaded.model.compute_logits(hidden)


def test_llm_compressor_fp8_dynamic_moe_keeps_fp8_experts_and_matches_the_dequantized_path(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="nanocore"):
        loaded, ours = producer_logits("triton_fused_moe", monkeypatch)
    assert any("2 of 2 layers hold fp8" in r.message for r in caplog.records)
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.w13.dtype == torch.float8_e4m3fn and experts.weight_format == "fp8_channel"
    from safetensors import safe_open
    with safe_open(str(FP8_DYNAMIC / "model.safetensors"), "pt") as f:
        scale = f.get_tensor(f"{EXPERTS}.2.up_proj.weight_scale")
    torch.testing.assert_close(experts.w13_scale.data[2, experts.intermediate_per_rank:], scale.float().flatten())
    _, dequantized_path = producer_logits("eager")
    err = ((ours - dequantized_path).abs().max() / dequantized_path.abs().max()).item()
    assert err <= 1e-5, f"fp8 experts vs dequantized experts: largest logit error {err:.3g} of the largest logit"


@pytest.mark.slow
def test_expert_parallel_two_ranks_with_fp8_experts_equals_one(tmp_path):
    """EP=2 over gloo with fp8 experts (each rank its experts and scales) equals EP=1 on the dequantized weights."""
    run_two_rank_script(Path(__file__).with_name("moe_ep_fp8_worker.py"), tmp_path)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_fp8_experts_on_the_gpu_match_the_dequantized_path_and_take_half_the_bytes():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 experts need CUDA capability >= 8.9")
    ids = torch.load(FP8_DYNAMIC / "reference_logits.pt")["input_ids"].cuda()
    logits, expert_bytes = {}, {}
    for executor in ("triton_fused_moe", "eager"):
        loaded = load_model(EngineConfig(model=str(FP8_DYNAMIC), moe_executor=executor, dtype="bfloat16"), "cuda")
        experts = loaded.model.model.layers[0].mlp.experts
        expert_bytes[executor] = experts.w13.nbytes + experts.w2.nbytes
        with torch.no_grad():
            hidden = loaded.model(ids, torch.arange(len(ids), device="cuda"),
                                  AttentionMetadata.for_prefill([len(ids)], device="cuda"))
            logits[executor] = loaded.model.compute_logits(hidden).float()
    assert expert_bytes["triton_fused_moe"] * 2 == expert_bytes["eager"]
    err = ((logits["triton_fused_moe"] - logits["eager"]).abs().max() / logits["eager"].abs().max()).item()
    assert err <= 3e-2, f"fp8 experts vs dequantized bf16 experts: largest logit error {err:.3g}"


def test_the_fp8_experts_dummy_preset_holds_fp8_experts_and_float_everything_else(monkeypatch):
    """``dummy:Qwen1.5-MoE-A2.7B-fp8-experts`` (for ``nanocore bench``): experts fp8, every other linear unquantized
    (its ignore list), so fp8 vs bf16 experts can be compared alone. Shrunk here to run on CPU."""
    import nanocore.loader.model_loader as model_loader
    from transformers import AutoConfig

    from nanocore.loader.presets import preset_dict

    def small(name):
        values = preset_dict(name)
        values.update(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                      shared_expert_intermediate_size=64, num_attention_heads=4, num_key_value_heads=4, num_experts=4,
                      vocab_size=128)
        return AutoConfig.for_model(values.pop("model_type"), **values)

    monkeypatch.setattr(model_loader, "preset_config", small)
    monkeypatch.setattr(TritonFusedMoEExecutor, "supports", classmethod(lambda cls, device: None))
    loaded = load_model(EngineConfig(model="dummy:Qwen1.5-MoE-A2.7B-fp8-experts", moe_executor="triton_fused_moe"),
                        "cpu")
    layer = loaded.model.model.layers[1]
    assert layer.mlp.experts.w13.dtype == torch.float8_e4m3fn
    assert all(type(m.linear_method).__name__ == "UnquantizedLinearMethod" for m in loaded.model.linear_layers())
    with torch.no_grad():
        hidden = loaded.model(torch.arange(5), torch.arange(5), AttentionMetadata.for_prefill([5]))
    assert torch.isfinite(hidden).all()


def test_bench_moe_times_executors_on_fp8_experts_too(monkeypatch):
    """``nanocore bench moe --weight-formats float,fp8_channel``: a NAME+fp8 column per executor taking fp8 experts,
    whose bandwidth counts one byte per weight (timings faked: the bench needs a GPU)."""
    import nanocore.bench.moe as bench

    monkeypatch.setattr(bench, "time_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench, "graph_replay", lambda fn: fn)
    executors = bench.variants({"eager": EagerMoEExecutor(), "fused": TritonFusedMoEExecutor({"impl": "torch"})},
                               ["float", "fp8_channel"], device="cpu")
    assert list(executors) == ["eager", "fused", "fused+fp8"]
    row = bench.bench_case(executors, bench.ExpertShape("tiny", 4, 2, 32, 16), 3, torch.bfloat16, device="cpu")
    row = bench.summarise(row, "eager", list(executors))
    assert row["fused_tb_per_s"] == 2 * row["fused+fp8_tb_per_s"]
    with pytest.raises(ValueError, match="no executor"):
        bench.variants({"eager": EagerMoEExecutor()}, ["fp8_channel"], device="cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_fp8_experts_decode_in_cuda_graphs_as_without():
    """The engine with fp8 experts: greedy tokens with CUDA graphs (decode captured) equal those run eagerly."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 experts need CUDA capability >= 8.9")
    from nanocore import LLM, SamplingParams

    prompts = [[int(t) for t in torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (3, 17, 40, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tokens = []
    for enforce_eager in (False, True):
        llm = LLM(str(FP8_DYNAMIC), device="cuda", dtype="bfloat16", moe_executor="triton_fused_moe",
                  max_model_len=128, max_num_seqs=4, num_kv_blocks=64, enforce_eager=enforce_eager)
        assert llm.engine.loaded.model.model.layers[0].mlp.experts.weight_format == "fp8_channel"
        tokens.append([out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)])
        llm.close()
    assert tokens[0] == tokens[1]
