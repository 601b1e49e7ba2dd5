"""awq: loading AutoAWQ tensors through the parallel layers (packed output dim, TP), errors, quantize."""
import pytest
import torch
import torch.nn.functional as F

from nanocore.distributed import ParallelContext
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore.toolkit.numerics import awq_dequantize, awq_pack
from nanocore_awq import AWQLinearMethod
from nanocore_awq.search import apply_awq_scales


def load(layer, tensors, shard_id=None):
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))


def dequantized(layer):
    return awq_dequantize(layer.qweight, layer.qzeros, layer.scales).float().t()


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_qkv_and_gate_up_shards_along_the_packed_output_dim(tp_rank):
    parallel = ParallelContext(tp_rank=tp_rank, tp_size=2)
    qkv = QKVParallelLinear(256, 16, 4, 2, linear_method=AWQLinearMethod(), parallel=parallel,
                            params_dtype=torch.float16)
    full = {s: awq_pack(torch.randn(rows, 256), 128) for s, rows in (("q", 64), ("k", 32), ("v", 32))}
    for shard_id, tensors in full.items():
        load(qkv, tensors, shard_id)
    expected = torch.cat([awq_dequantize(**full[s]).float().t().chunk(2)[tp_rank] for s in "qkv"])
    torch.testing.assert_close(dequantized(qkv), expected)
    gate_up = MergedColumnParallelLinear(256, [48, 48], linear_method=AWQLinearMethod(), parallel=parallel,
                                         params_dtype=torch.float16)
    halves = [awq_pack(torch.randn(48, 256), 128) for _ in range(2)]
    for i, tensors in enumerate(halves):
        load(gate_up, tensors, i)
    expected = torch.cat([awq_dequantize(**h).float().t().chunk(2)[tp_rank] for h in halves])
    torch.testing.assert_close(dequantized(gate_up), expected)


def test_row_parallel_shards_groups_along_the_input_dim():
    w = torch.randn(16, 512)
    tensors = awq_pack(w, 128)
    x = torch.randn(3, 512, dtype=torch.float16)
    parts = []
    for rank in (0, 1):
        layer = RowParallelLinear(512, 16, linear_method=AWQLinearMethod(),
                                  parallel=ParallelContext(tp_rank=rank, tp_size=2), params_dtype=torch.float16)
        load(layer, tensors)
        parts.append(layer.linear_method.apply(layer, x.chunk(2, dim=1)[rank]).float())
    expected = x.float() @ awq_dequantize(**tensors).float()
    torch.testing.assert_close(parts[0] + parts[1], expected, rtol=2e-2, atol=2e-2)


def test_mismatching_checkpoints_are_clear_errors():
    layer = RowParallelLinear(256, 16, linear_method=AWQLinearMethod(), parallel=ParallelContext(),
                              params_dtype=torch.float16)
    with pytest.raises(CheckpointFormatError, match="expected torch.int32"):
        layer.qweight.weight_loader(layer.qweight, torch.zeros(256, 2, dtype=torch.int16))
    wrong_group = awq_pack(torch.randn(16, 256), 64)  # made with group 64, loaded as group 128
    with pytest.raises(CheckpointFormatError, match="group size"):
        load(layer, wrong_group)
    layer = RowParallelLinear(256, 16, linear_method=AWQLinearMethod(), parallel=ParallelContext(),
                              params_dtype=torch.float16)
    layer.qweight.weight_loader(layer.qweight, awq_pack(torch.randn(16, 256), 128)["qweight"])
    with pytest.raises(CheckpointFormatError, match="no \\['qzeros', 'scales'\\]"):
        layer.linear_method.process_weights_after_loading(layer)
    with pytest.raises(CheckpointFormatError, match="bits=8"):
        AWQLinearMethod({"quantization_config": {"quant_method": "awq", "bits": 8, "group_size": 128}})
    assert AWQLinearMethod({"quantization_config": {"quant_method": "awq", "group_size": 64}}).group_size == 64


def llama_layer(hidden=256, inter=384, heads=4, kv_heads=2, head_dim=64):
    g = torch.Generator().manual_seed(0)
    w = lambda *s: torch.randn(*s, generator=g) / s[-1] ** 0.5  # noqa: E731
    p = "model.layers.0."
    return {p + "input_layernorm.weight": torch.rand(hidden, generator=g) + 0.5,
            p + "post_attention_layernorm.weight": torch.rand(hidden, generator=g) + 0.5,
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(inter, hidden), p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter)}


def test_awq_search_beats_round_to_nearest_on_outlier_activations():
    weights = llama_layer()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g) * (1 + 20 * (torch.rand(256, generator=g) > 0.97))  # salient channels
    h = torch.randn(64, 384, generator=g) * (1 + 20 * (torch.rand(384, generator=g) > 0.97))
    p = "model.layers.0."
    calibration = {p + "self_attn.q_proj": x, p + "self_attn.k_proj": x, p + "self_attn.v_proj": x,
                   p + "mlp.gate_proj": x, p + "mlp.up_proj": x, p + "mlp.down_proj": h}
    rtn, config = AWQLinearMethod.quantize(weights)
    awq, config_awq = AWQLinearMethod.quantize(weights, calibration)
    assert not config["awq_scale_search"] and config_awq["awq_scale_search"]

    def err(tensors, proj, norm, inp):
        y = F.linear(inp, weights[p + proj + ".weight"])
        folded = inp * (tensors[p + norm].float() / weights[p + norm]) if norm else inp
        w_t = awq_dequantize(tensors[p + proj + ".qweight"], tensors[p + proj + ".qzeros"], tensors[p + proj + ".scales"])
        return float((folded @ w_t.float() - y).pow(2).mean())

    assert err(awq, "self_attn.q_proj", "input_layernorm.weight", x) < err(rtn, "self_attn.q_proj", None, x)
    assert err(awq, "mlp.gate_proj", "post_attention_layernorm.weight", x) < err(rtn, "mlp.gate_proj", None, x)
    assert p + "self_attn.v_proj.weight" not in awq  # replaced by qweight / qzeros / scales
    assert awq[p + "self_attn.q_proj.qweight"].shape == (256, 256 // 8)


def test_folding_keeps_the_float_layer_unchanged():
    weights = llama_layer(kv_heads=4)  # v_proj and o_proj line up, so that fold is taken too
    p = "model.layers.0."
    x = torch.randn(16, 256) * (1 + 10 * (torch.rand(256) > 0.9))
    targets = [p + n for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")]
    scaled = apply_awq_scales(weights, {t: x for t in targets}, targets, 128)
    assert set(scaled) >= {p + "input_layernorm.weight", p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight"}
    normed = x * weights[p + "input_layernorm.weight"]
    v = F.linear(normed, weights[p + "self_attn.v_proj.weight"])
    v_scaled = F.linear(x * scaled[p + "input_layernorm.weight"], scaled[p + "self_attn.v_proj.weight"])
    torch.testing.assert_close(F.linear(v_scaled, scaled[p + "self_attn.o_proj.weight"]),
                               F.linear(v, weights[p + "self_attn.o_proj.weight"]), rtol=1e-4, atol=1e-4)
