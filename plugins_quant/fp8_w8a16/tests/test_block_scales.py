"""Block-wise fp8 (one scale per 128 x 128 tile) in ``fp8_w8a16``: loading through the parallel layers (merged
q/k/v and gate/up whose shards do or do not start on a tile, fused tensors, TP shards), DeepSeek-V3's
``weight_scale_inv``, routing, and the other fp8 methods' reasons."""
import pytest
import torch
import torch.nn.functional as F

from nanocore.distributed import ParallelContext
from nanocore.interfaces import QuantArgs, QuantScheme
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore.toolkit.checkpoint_support import compressed_tensors_config
from nanocore.toolkit.gemm_block import dequantize_blocks
from nanocore.toolkit.numerics import quantize_fp8_blocks
from nanocore_fp8 import Fp8W8A8LinearMethod, Fp8W8A16LinearMethod

FP8_BLOCK = compressed_tensors_config(QuantScheme(QuantArgs(8, "float", "block", block_structure=(128, 128)),
                                                  QuantArgs(8, "float", "group", 128, dynamic=True)),
                                      "float-quantized")
DEEPSEEK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def method(config=FP8_BLOCK):
    return Fp8W8A16LinearMethod({"quantization_config": config})


def block_tensors(w, scale_name="weight_scale"):
    """(checkpoint tensors, the float weight they hold) of ``w`` quantized in 128 x 128 tiles."""
    q, scale = quantize_fp8_blocks(w)
    return {"weight": q, scale_name: scale}, dequantize_blocks(q, scale, (128, 128))


def load(layer, tensors, shard_id=None):
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))


def check_apply(layer, held, k=None, bias=None):
    layer.linear_method.process_weights_after_loading(layer)
    x = torch.randn(5, k or held.shape[1])
    torch.testing.assert_close(layer.linear_method.apply(layer, x, bias), F.linear(x, held, bias),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,k", [(256, 384), (200, 300), (100, 50)])
def test_one_shard_layers_keep_the_tiles(n, k):
    torch.manual_seed(n)
    layer = RowParallelLinear(k, n, linear_method=method(), parallel=ParallelContext(), params_dtype=torch.float32)
    tensors, held = block_tensors(torch.randn(n, k))
    load(layer, tensors)
    assert layer.linear_method.weights.layout == (128, 128)  # the whole output: tiles as the checkpoint has them
    assert tuple(layer.weight_scale.shape) == tuple(tensors["weight_scale"].shape)
    assert layer.weight.dtype == torch.float8_e4m3fn  # one byte per weight: no float copy
    check_apply(layer, held, bias=torch.randn(n))


@pytest.mark.parametrize("tp_rank", [0, 1])
@pytest.mark.parametrize("n", [512, 400])
def test_column_tp_slices_keep_tiles_on_a_tile_boundary_else_scale_rows(tp_rank, n):
    from nanocore.layers.linear import ColumnParallelLinear
    torch.manual_seed(n)
    layer = ColumnParallelLinear(300, n, linear_method=method(), parallel=ParallelContext(tp_rank=tp_rank, tp_size=2),
                                 params_dtype=torch.float32)
    tensors, held = block_tensors(torch.randn(n, 300))
    load(layer, tensors)
    assert layer.linear_method.weights.layout == ((128, 128) if n == 512 else (1, 128))  # 200 rows: off a tile
    check_apply(layer, held.chunk(2)[tp_rank])


@pytest.mark.parametrize("tp_rank", [0, 1])
@pytest.mark.parametrize("head_dim", [64, 40])  # k/v shards of 128 rows (tiles kept) or 80 (a partial tile)
def test_qkv_shards_and_tp(tp_rank, head_dim):
    torch.manual_seed(head_dim + tp_rank)
    parallel = ParallelContext(tp_rank=tp_rank, tp_size=2)
    hidden = 200
    qkv = QKVParallelLinear(hidden, head_dim, 8, 4, linear_method=method(), parallel=parallel,
                            params_dtype=torch.float32)
    held = {}
    for shard_id, rows in (("q", 8 * head_dim), ("k", 4 * head_dim), ("v", 4 * head_dim)):
        tensors, held[shard_id] = block_tensors(torch.randn(rows, hidden))
        load(qkv, tensors, shard_id)
    assert qkv.linear_method.weights.layout == ((128, 128) if head_dim == 64 else (1, 128))
    check_apply(qkv, torch.cat([held[s].chunk(2)[tp_rank] for s in "qkv"]))


def test_fused_gate_up_tensor_and_per_shard_tensors_agree():
    torch.manual_seed(0)
    w = torch.randn(2 * 288, 160)
    fused = MergedColumnParallelLinear(160, [288, 288], linear_method=method(), parallel=ParallelContext(),
                                       params_dtype=torch.float32)
    tensors, held = block_tensors(w)  # the checkpoint holds gate_up itself: tiles run over the fused rows
    load(fused, tensors)
    check_apply(fused, held)
    merged = MergedColumnParallelLinear(160, [288, 288], linear_method=method(), parallel=ParallelContext(),
                                        params_dtype=torch.float32)
    parts = [block_tensors(half) for half in w.chunk(2)]
    for i, (tensors, _) in enumerate(parts):
        load(merged, tensors, i)
    check_apply(merged, torch.cat([h for _, h in parts]))


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_row_parallel_input_shards_on_tile_columns(tp_rank):
    torch.manual_seed(tp_rank)
    parallel = ParallelContext(tp_rank=tp_rank, tp_size=2)
    layer = RowParallelLinear(512, 150, linear_method=method(), parallel=parallel, params_dtype=torch.float32)
    tensors, held = block_tensors(torch.randn(150, 512))
    load(layer, tensors)
    check_apply(layer, held.chunk(2, dim=1)[tp_rank])
    with pytest.raises(CheckpointFormatError, match="tensor_parallel_size"):
        RowParallelLinear(320, 150, linear_method=method(), parallel=parallel, params_dtype=torch.float32)


def test_deepseek_weight_scale_inv():
    torch.manual_seed(1)
    layer = RowParallelLinear(300, 200, linear_method=method(DEEPSEEK), parallel=ParallelContext(),
                              params_dtype=torch.float32)
    tensors, held = block_tensors(torch.randn(200, 300), "weight_scale_inv")
    load(layer, tensors)
    check_apply(layer, held)
    assert method(DEEPSEEK).quant_scheme().weights.block_structure == (128, 128)


def test_missing_or_wrong_scales_are_clear_errors():
    layer = RowParallelLinear(300, 200, linear_method=method(), parallel=ParallelContext(),
                              params_dtype=torch.float32)
    tensors, _ = block_tensors(torch.randn(200, 300))
    layer.weight.weight_loader(layer.weight, tensors["weight"])
    with pytest.raises(CheckpointFormatError, match="no \\['weight_scale'\\]"):
        layer.linear_method.process_weights_after_loading(layer)
    with pytest.raises(CheckpointFormatError, match="block_structure"):
        layer.weight_scale.weight_loader(layer.weight_scale, torch.ones(200, 3))  # per row, not per tile
    qkv = QKVParallelLinear(300, 40, 4, 2, linear_method=method(), parallel=ParallelContext(),
                            params_dtype=torch.float32)  # scale rows per weight row: expanded at load
    with pytest.raises(CheckpointFormatError, match="another block_structure"):
        qkv.weight_scale.weight_loader(qkv.weight_scale, torch.ones(80, 3), "k")


def test_routing_and_reasons():
    assert Fp8W8A16LinearMethod.checkpoint_support(FP8_BLOCK) is None
    assert Fp8W8A16LinearMethod.checkpoint_support(DEEPSEEK) is None
    for config in (FP8_BLOCK, DEEPSEEK):
        reason = Fp8W8A8LinearMethod.checkpoint_support(config)
        assert "block-wise" in reason and "fp8_w8a16" in reason
    odd = {**DEEPSEEK, "weight_block_size": [128, 100]}
    assert "[128, 128]" in Fp8W8A16LinearMethod.checkpoint_support(odd)
    with pytest.raises(CheckpointFormatError, match="fp8_w8a16"):
        Fp8W8A8LinearMethod({"quantization_config": DEEPSEEK})


def test_auto_picks_fp8_w8a16_for_block_fp8():
    from types import SimpleNamespace

    from nanocore.loader.linear_routing import resolve_linear_method
    for config in (FP8_BLOCK, DEEPSEEK):
        entry, _ = resolve_linear_method("auto", {}, SimpleNamespace(quantization_config=config),
                                         torch.device("cpu"))
        assert entry.name == "fp8_w8a16"
        with pytest.raises(ValueError, match="fp8_w8a16"):
            resolve_linear_method("fp8_w8a8", {}, SimpleNamespace(quantization_config=config), torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 40])  # qkv with tiles kept / scale rows per weight row
@pytest.mark.parametrize("m", [1, 7, 300])
def test_triton_kernel_through_the_layer_on_cuda(head_dim, m):
    torch.manual_seed(m)
    options = {"quantization_config": FP8_BLOCK, "kernel": "triton"}
    qkv = QKVParallelLinear(1000, head_dim, 16, 4, linear_method=Fp8W8A16LinearMethod(options),
                            parallel=ParallelContext(), params_dtype=torch.bfloat16)
    held = {}
    for shard_id, rows in (("q", 16 * head_dim), ("k", 4 * head_dim), ("v", 4 * head_dim)):
        tensors, held[shard_id] = block_tensors(torch.randn(rows, 1000))
        load(qkv, tensors, shard_id)
    qkv.linear_method.process_weights_after_loading(qkv)
    qkv.to("cuda")
    x = torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16)
    got = qkv.linear_method.apply(qkv, x).float()
    expected = x.float() @ torch.cat([held[s] for s in "qkv"]).cuda().t()
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-2
