"""Tensor parallelism: shard placement of the generic weight_loader, and TP=2 on gloo equal to TP=1."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint, nanocore_logits
from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore.config import EngineConfig
from nanocore.distributed import ParallelContext
from nanocore.interfaces import LinearMethod, set_weight_attrs
from nanocore.layers.embedding import ParallelLMHead
from nanocore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanocore.loader import load_model

HIDDEN, HEAD_DIM = 16, 4


def _qkv(rank, tp, num_kv_heads, method=None):
    return QKVParallelLinear(HIDDEN, HEAD_DIM, 4, num_kv_heads, bias=True, linear_method=method or UnquantizedLinearMethod(),
                             parallel=ParallelContext(tp_rank=rank, tp_size=tp), params_dtype=torch.float32)


def test_qkv_shards_land_at_offsets():
    q, k, v = torch.randn(16, HIDDEN), torch.randn(8, HIDDEN), torch.randn(8, HIDDEN)
    layer = _qkv(rank=1, tp=2, num_kv_heads=2)
    for shard_id, w in zip("qkv", (q, k, v)):
        layer.weight_loader(layer.weight, w, shard_id)
    assert torch.equal(layer.weight, torch.cat([q[8:], k[4:], v[4:]]))


def test_kv_heads_replicated_when_tp_exceeds_them():
    k = torch.randn(8, HIDDEN)  # 2 kv heads of 4 dims, tp=4: ranks 0,1 hold head 0; ranks 2,3 head 1
    for rank in range(4):
        layer = _qkv(rank=rank, tp=4, num_kv_heads=2)
        assert layer.num_kv_heads == 1 and layer.weight.shape == (4 + 4 + 4, HIDDEN)
        layer.weight_loader(layer.weight, k, "k")
        assert torch.equal(layer.weight[4:8], k[(rank // 2) * 4:(rank // 2 + 1) * 4])


def test_fused_checkpoint_tensor_is_split():
    w = torch.randn(32, HIDDEN)
    layer = _qkv(rank=0, tp=1, num_kv_heads=2)
    layer.weight_loader(layer.weight, w)
    assert torch.equal(layer.weight, w)


class PackedMethod(LinearMethod):
    """AWQ-like layout: qweight [K, N/8] packed along the output, scales [K/g, N], one scale per shard."""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, weight_loader):
        n, k = sum(output_partition_sizes), input_size_per_partition
        specs = {"qweight": ((k, n // 8), torch.int32, dict(input_dim=0, output_dim=1, packed_dim=1, packed_factor=8)),
                 "scales": ((k // 4, n), torch.float32, dict(input_dim=0, output_dim=1)),
                 "tensor_scale": ((len(output_partition_sizes),), torch.float32, {})}
        for name, (shape, dtype, attrs) in specs.items():
            param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            set_weight_attrs(param, {"weight_loader": weight_loader, **attrs})
            layer.register_parameter(name, param)

    def apply(self, layer, x, bias=None):
        raise NotImplementedError


def test_packed_and_per_shard_params_load_generically():
    layer = MergedColumnParallelLinear(32, [64, 64], linear_method=PackedMethod(), params_dtype=torch.float32,
                                       parallel=ParallelContext(tp_rank=1, tp_size=2))
    gate_q, up_q = torch.randint(0, 99, (32, 8), dtype=torch.int32), torch.randint(0, 99, (32, 8), dtype=torch.int32)
    gate_s, up_s = torch.randn(8, 64), torch.randn(8, 64)
    for shard, (qw, sc, ts) in enumerate([(gate_q, gate_s, 0.5), (up_q, up_s, 2.0)]):
        layer.weight_loader(layer.qweight, qw, shard)
        layer.weight_loader(layer.scales, sc, shard)
        layer.weight_loader(layer.tensor_scale, torch.tensor(ts), shard)
    assert torch.equal(layer.qweight, torch.cat([gate_q[:, 4:], up_q[:, 4:]], dim=1))
    assert torch.equal(layer.scales, torch.cat([gate_s[:, 32:], up_s[:, 32:]], dim=1))
    assert layer.tensor_scale.tolist() == [0.5, 2.0]


def test_row_parallel_narrows_input_and_bias_is_whole():
    layer = RowParallelLinear(32, 8, bias=True, linear_method=UnquantizedLinearMethod(), params_dtype=torch.float32,
                              parallel=ParallelContext(tp_rank=1, tp_size=2))
    w, b = torch.randn(8, 32), torch.randn(8)
    layer.weight_loader(layer.weight, w)
    layer.weight_loader(layer.bias, b)
    assert torch.equal(layer.weight, w[:, 16:]) and torch.equal(layer.bias, b)


def test_lm_head_pads_vocab_and_shards():
    head = ParallelLMHead(250, 8, parallel=ParallelContext(tp_rank=1, tp_size=2), params_dtype=torch.float32)
    table = torch.randn(250, 8)
    head.weight_loader(head.weight, table)
    assert head.weight.shape == (128, 8)  # 250 -> 256 padded, 128 rows per rank
    assert torch.equal(head.weight[:122], table[128:]) and not head.weight[122:].any()


def test_bad_head_split_is_a_clear_error():
    with pytest.raises(ValueError, match="num_attention_heads.*not divisible by the parallel size 3"):
        _qkv(rank=0, tp=3, num_kv_heads=2)


def test_tp2_gloo_equals_tp1(tmp_path):
    """Llama (untied, tied) and Qwen2 with GQA (2 KV heads) and an unpadded vocab of 250."""
    checkpoints = [make_checkpoint(tmp_path / "llama", "llama"),
                   make_checkpoint(tmp_path / "llama_tied", "llama_tied"),
                   make_checkpoint(tmp_path / "qwen2", "qwen2", vocab_size=250)]
    out = tmp_path / "out"
    out.mkdir()
    worker = Path(__file__).parent / "tp_worker.py"
    result = subprocess.run([sys.executable, str(worker), str(out), *map(str, checkpoints)],
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    seqs = [[5, 17, 200, 3, 99, 42, 7, 150, 249], [8, 1, 77]]
    for ckpt in checkpoints:
        reference = nanocore_logits(load_model(EngineConfig(model=str(ckpt), device="cpu"), "cpu").model, seqs)
        for rank in range(2):
            saved = torch.load(out / f"{ckpt.name}.rank{rank}.pt")
            assert saved["kv_cache_spec"] == (2, 1, 16)
            torch.testing.assert_close(saved["logits"], reference, atol=1e-5, rtol=1e-5)
