"""GPTQ checkpoints (``quant_method: gptq``, act-order ``g_idx``) load into ``wna16``.

The tensors here follow the documented GPTQ v1 layout: ``qweight [K/8, N]`` int32 packed along K (value i of a word
at bits 4i), ``qzeros [G, N/8]`` packed along N holding zero - 1, fp16 ``scales [G, N]``, ``g_idx [K]`` (the group of
each input); unlike GPTQModel's own output (test_gptq_producer.py) the act-order differs per q/k/v shard.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint, nanocore_logits

from nanocore.config import EngineConfig
from nanocore.loader import load_model
from nanocore.toolkit.int_packing import pack_int32

GROUP = 64
SIZES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def gptq_tensors(w: torch.Tensor, g: torch.Generator) -> tuple[dict, torch.Tensor]:
    """GPTQ v1 tensors of ``w [N, K]`` with a random act-order, and the float weight they hold."""
    n, k = w.shape
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[torch.randperm(k, generator=g)] = torch.arange(k, dtype=torch.int32) // GROUP  # desc_act: any order
    groups = k // GROUP
    scales, zeros = torch.empty(groups, n), torch.empty(groups, n, dtype=torch.int32)
    for group in range(groups):
        cols = w[:, g_idx == group].float()
        lo, hi = cols.amin(1).clamp_max(0), cols.amax(1).clamp_min(0)
        scales[group] = ((hi - lo) / 15).clamp_min(1e-8).half().float()
        zeros[group] = (-lo / scales[group]).round().clamp(1, 15).int()  # v1 stores zero - 1: keep zero >= 1
    s, z = scales[g_idx.long()].t(), zeros[g_idx.long()].t()  # [N, K]
    q = (w / s).round().add(z).clamp(0, 15).int()
    held = (q - z).float() * s
    tensors = {"qweight": pack_int32(q.t(), 4, dim=0), "qzeros": pack_int32(zeros - 1, 4, dim=1),
               "scales": scales.half(), "g_idx": g_idx}
    return tensors, held


def write_gptq(src: Path, quantized: Path, dequantized: Path) -> None:
    tensors = load_file(str(src / "model.safetensors"))
    packed, held, g = {}, {}, torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if name.endswith("proj.weight"):
            prefix = name[: -len(".weight")]
            written, held[name] = gptq_tensors(t, g)
            packed.update({f"{prefix}.{suffix}": v for suffix, v in written.items()})
        else:
            packed[name] = held[name] = t
    config = json.loads((src / "config.json").read_text())
    for folder, weights in ((dequantized, held), (quantized, packed)):
        folder.mkdir()
        save_file(weights, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config))
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True,
                                         "sym": False, "checkpoint_format": "gptq"}


def test_gptq_act_order_loads_into_wna16(tmp_path):
    src = make_checkpoint(tmp_path / "float", "qwen2", **SIZES)
    write_gptq(src, tmp_path / "gptq", tmp_path / "held")
    gptq = load_model(EngineConfig(model=str(tmp_path / "gptq"), dtype="float32"), "cpu")
    held = load_model(EngineConfig(model=str(tmp_path / "held"), dtype="float32"), "cpu")
    assert gptq.linear_method == "wna16"
    seqs = [[5, 17, 200, 3, 99, 42, 7], [1, 2, 3]]
    ours, want = nanocore_logits(gptq.model, seqs), nanocore_logits(held.model, seqs)
    torch.testing.assert_close(ours, want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)
