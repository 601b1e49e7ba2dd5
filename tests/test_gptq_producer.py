"""GPTQ checkpoints written by GPTQModel 7.6.0 itself (benchmarks/make_gptq_checkpoint.py, on CPU) load into ``wna16``.

Each folder under tests/data/producers is GPTQModel's own output (``quant_method: gptq``, ``checkpoint_format:
gptq`` = v1 zero points, one ``gptq_v2``; ``desc_act: true`` so ``g_idx`` is a real act-order permutation) of the
tiny random Llama / Qwen2 the other producer checkpoints use. ``reference_logits.pt`` holds two references made by GPTQModel:

- ``logits``: a float32 model holding GPTQModel's own ``dequantize_weight`` of every quantized linear (after its own
  v1 -> v2 load; float16 scales widened to float32). nanocore's float32 path holds the same float32 weights (integer
  codes and float16 scales are exact in float32), so the only difference left is float32 summation order:
  measured 8e-7 .. 1.1e-6 of the largest logit; the bound is the 1e-4 test_producer_checkpoints.py uses for
  weight-only formats.
- ``forward_logits``: GPTQModel's own forward (its ``TorchLinear`` kernel, float16 only): activations, weights and
  every sum rounded to float16 (2^-11 relative), measured 1.3e-3 .. 1.7e-3 of the largest logit against both
  nanocore and its own float32 dequantization; the bound is 5e-3, and the greedy tokens must agree.

The asymmetric checkpoints hold zero points 0 (rows with no negative weight), which GPTQ v1 stores as -1 by
subtracting 0x11111111 from the whole packed word (a borrow); before nanocore read v1 words the way GPTQModel does,
those checkpoints gave 0.47 (Llama) and 0.28 (Qwen2) of the largest logit of error.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanocore.config import EngineConfig
from nanocore.layers.attention import AttentionMetadata
from nanocore.loader import load_model
from nanocore.toolkit.int_packing import pack_int32, unpack_int32

PRODUCERS = Path(__file__).parent / "data" / "producers"
#: folder -> (group size, symmetric, checkpoint_format), as benchmarks/make_gptq_checkpoint.py writes them
GPTQ_PRODUCED = {
    "llama_gptq_actorder": (32, True, "gptq"),
    "llama_gptq_actorder_asym": (64, False, "gptq"),
    "llama_gptq_v2_actorder_asym": (64, False, "gptq_v2"),
    "qwen2_gptq_actorder_asym": (32, False, "gptq"),
}


def logits_of(folder: Path, method: str = "auto"):
    reference = torch.load(folder / "reference_logits.pt")
    loaded = load_model(EngineConfig(model=str(folder), linear_method=method, dtype="float32"), "cpu")
    ids = reference["input_ids"]
    with torch.no_grad():
        hidden = loaded.model(ids, torch.arange(len(ids)), AttentionMetadata.for_prefill([len(ids)]))
        return loaded, loaded.model.compute_logits(hidden), reference


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


@pytest.mark.parametrize("name", sorted(GPTQ_PRODUCED))
def test_the_folder_is_what_gptqmodel_wrote(name):
    """The checkpoint exercises what it is here for: GPTQModel's own act-order v1 output of the declared scheme."""
    folder = PRODUCERS / name
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    group, sym, fmt = GPTQ_PRODUCED[name]
    assert config["quant_method"] == "gptq" and config["checkpoint_format"] == fmt
    assert config["meta"]["quantizer"] == ["gptqmodel:7.6.0"]
    assert (config["bits"], config["group_size"], config["desc_act"], config["sym"]) == (4, group, True, sym)
    tensors = load_file(folder / "model.safetensors")
    g_idx = tensors["model.layers.0.self_attn.q_proj.g_idx"]
    contiguous = torch.arange(len(g_idx)) // group
    assert not torch.equal(g_idx.long(), contiguous)  # act-order: not the trivial grouping
    assert torch.equal(g_idx.long().sort().values, contiguous)  # each group still holds group_size inputs
    stored = torch.cat([unpack_int32(t, 4, t.shape[1] * 8, dim=1).flatten()
                        for n, t in tensors.items() if n.endswith("qzeros")])
    if fmt == "gptq":  # v1 zero - 1 reaches 15 only by a borrow (zero point 0 beside it)
        assert bool((stored == 15).any()) == (not sym)
    else:  # v2 holds the zero points: some are 0
        assert bool((stored == 0).any())


@pytest.mark.parametrize("name", sorted(GPTQ_PRODUCED))
def test_auto_picks_wna16(name, caplog):
    with caplog.at_level(logging.INFO, logger="nanocore"):
        loaded, ours, reference = logits_of(PRODUCERS / name)
    assert loaded.linear_method == "wna16"
    assert any("auto linear_method" in r.message and "wna16" in r.message for r in caplog.records)
    assert torch.equal(ours.argmax(-1), reference["logits"].argmax(-1))


@pytest.mark.parametrize("name", sorted(GPTQ_PRODUCED))
def test_logits_match_gptqmodel_dequantized_weights(name):
    _, ours, reference = logits_of(PRODUCERS / name, "wna16")
    err = relative_error(ours, reference["logits"])
    assert err <= 1e-4, f"{name}: largest logit error {err:.3g} of the largest logit"


@pytest.mark.parametrize("name", sorted(GPTQ_PRODUCED))
def test_logits_match_gptqmodel_own_forward(name):
    _, ours, reference = logits_of(PRODUCERS / name, "wna16")
    forward = reference["forward_logits"]
    err = relative_error(ours, forward)
    assert err <= 5e-3, f"{name}: largest logit error {err:.3g} of the largest logit against GPTQModel's forward"
    assert torch.equal(ours.argmax(-1), forward.argmax(-1))


def test_gptqmodel_v1_zero_point_words():
    """GPTQModel's v2 -> v1 (subtract 0x11111111 from each word) and back: a zero point 0 borrows from its
    neighbour; nanocore's reading restores every value, and equals "unpacked + 1" wherever nothing borrowed."""
    from nanocore_awq.wna16_layouts import gptq_v1_words_to_v2

    zeros = torch.tensor([[0, 5, 15, 0, 1, 8, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10], [0] * 8, [15] * 8])
    v2_words = pack_int32(zeros, 4, dim=1)
    v1_words = ((v2_words.long() - 0x11111111) & 0xFFFFFFFF)
    v1_words = torch.where(v1_words >= 2**31, v1_words - 2**32, v1_words).to(torch.int32)
    assert torch.equal(unpack_int32(gptq_v1_words_to_v2(v1_words, 4), 4, 8, dim=1), zeros)
    no_borrow = unpack_int32(v1_words[1:2], 4, 8, dim=1) + 1
    assert torch.equal(no_borrow, zeros[1:2])
    eight = torch.tensor([[0, 200, 0, 1]])
    v1_eight = pack_int32(eight, 8, dim=1).long() - 0x01010101
    v1_eight = torch.where(v1_eight < -2**31, v1_eight + 2**32, v1_eight).to(torch.int32)
    assert torch.equal(unpack_int32(gptq_v1_words_to_v2(v1_eight, 8), 8, 4, dim=1), eight)


def test_gptqmodel_v1_and_v2_outputs_hold_the_same_weights():
    """GPTQModel wrote the asymmetric Llama twice (v1 and ``format="gptq_v2"``; its quantization is deterministic):
    nanocore's v1 reading of the v1 words is the v2 words, and both load to the same logits."""
    from nanocore_awq.wna16_layouts import gptq_v1_words_to_v2

    v1 = load_file(PRODUCERS / "llama_gptq_actorder_asym" / "model.safetensors")
    v2 = load_file(PRODUCERS / "llama_gptq_v2_actorder_asym" / "model.safetensors")
    assert sorted(v1) == sorted(v2)
    for name, t in v1.items():
        assert torch.equal(gptq_v1_words_to_v2(t, 4) if name.endswith("qzeros") else t, v2[name]), name
    _, ours_v1, _ = logits_of(PRODUCERS / "llama_gptq_actorder_asym")
    _, ours_v2, _ = logits_of(PRODUCERS / "llama_gptq_v2_actorder_asym")
    assert torch.equal(ours_v1, ours_v2)


def test_gptqmodel_planar_format_is_a_clear_error(tmp_path):
    """GPTQModel's ``gptq_p`` (split-plane packing) is another layout: refused, naming it and what loads."""
    import shutil

    folder = tmp_path / "planar"
    shutil.copytree(PRODUCERS / "llama_gptq_actorder", folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq_p"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="gptq_p") as info:
        load_model(EngineConfig(model=str(folder)), "cpu")
    assert "gptq_v2" in str(info.value)
