"""Alignment, the torch twin and the Triton kernels (interpreted on CPU) against the ``eager`` oracle."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocore.toolkit.reference import EagerMoEExecutor
from nanocore_triton_fused_moe import TritonFusedMoEExecutor
from nanocore_triton_fused_moe.align import align_slots
from nanocore_triton_fused_moe.configs import ConfigTable, config_file_name, default_config, triton_version
from nanocore_triton_fused_moe.reference import fused_moe_torch


def moe_inputs(m, e, k, h, i, dtype=torch.float32, drop=0.0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g)
    weights = torch.rand(m, k, generator=g)
    ids = torch.randint(0, e, (m, k), generator=g)
    dropped = torch.rand(m, k, generator=g) < drop
    ids = torch.where(dropped, torch.where(torch.rand(m, k, generator=g) < 0.5, -1, e + 3), ids)
    w13 = torch.randn(e, 2 * i, h, generator=g) * h ** -0.5
    w2 = torch.randn(e, h, i, generator=g) * i ** -0.5
    return [t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in (x, weights, ids, w13, w2)]


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 40), e=st.integers(1, 9), k=st.integers(1, 4), block_m=st.sampled_from([1, 4, 16]),
       drop=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 1000))
def test_alignment_groups_every_valid_slot_once_in_single_expert_blocks(m, e, k, block_m, drop, seed):
    ids = moe_inputs(m, e, k, 1, 1, drop=drop, seed=seed)[2]
    aligned = align_slots(ids, e, block_m)
    rows = int(aligned.num_rows)
    assert rows % block_m == 0
    slots, experts = aligned.sorted_slots[:rows].long(), aligned.block_experts.long()
    flat = ids.flatten()
    valid = ((flat >= 0) & (flat < e)).nonzero().flatten()
    real = slots[slots < m * k]
    assert sorted(real.tolist()) == valid.tolist(), "each valid slot exactly once, dropped slots absent"
    assert bool((aligned.sorted_slots[rows:] == m * k).all()), "rows past num_rows are padding"
    block_of_row = torch.arange(rows) // block_m
    assert torch.equal(flat[real], experts[block_of_row[slots < m * k]]), "a block holds one expert's slots"


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 24), e=st.integers(1, 8), k=st.integers(1, 3), h=st.integers(1, 24), i=st.integers(1, 24),
       block_m=st.sampled_from([1, 16, 64]), drop=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 1000))
def test_torch_twin_matches_eager(m, e, k, h, i, block_m, drop, seed):
    args = moe_inputs(m, e, k, h, i, drop=drop, seed=seed)
    torch.testing.assert_close(fused_moe_torch(*args, block_m=block_m), EagerMoEExecutor().apply(*args),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("m,e,k,h,i,drop,dtype", [
    (1, 8, 2, 64, 32, 0.0, torch.float32),     # decode: one token
    (1, 4, 4, 48, 40, 0.5, torch.float16),     # one token, some slots owned by another EP rank
    (37, 6, 3, 80, 24, 0.3, torch.float32),    # sizes that are not multiples of the tiles
    (130, 5, 2, 32, 64, 0.0, torch.float16),   # several blocks per expert
    (20, 3, 2, 16, 16, 1.0, torch.float32),    # every slot routed outside this rank: all zeros
])
def test_triton_kernels_interpreted_match_eager(m, e, k, h, i, drop, dtype):
    args = moe_inputs(m, e, k, h, i, dtype=dtype, drop=drop, seed=m)
    out = TritonFusedMoEExecutor({"impl": "triton"}).apply(*args)
    expected = EagerMoEExecutor().apply(*args)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    if drop == 1.0:
        assert torch.count_nonzero(out) == 0


def test_default_configs_grow_with_rows_per_expert():
    small, large = default_config(1, 64, 8), default_config(4096, 8, 2)
    assert small["BLOCK_M"] == 16 and large["BLOCK_M"] == 64


def test_tuned_table_is_found_and_nearest_batch_wins(tmp_path):
    name = config_file_name(8, 32, torch.float32, "cpu", triton_version())
    tile = dict(BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2)
    (tmp_path / name).write_text(json.dumps({"1": dict(BLOCK_M=16, **tile), "512": dict(BLOCK_M=4, **tile)}))
    table = ConfigTable(str(tmp_path))
    assert table.pick(2, 8, 32, 2, torch.float32, torch.device("cpu"))["BLOCK_M"] == 16
    assert table.pick(400, 8, 32, 2, torch.float32, torch.device("cpu"))["BLOCK_M"] == 4
    args = moe_inputs(9, 8, 2, 16, 32, seed=3)
    out = TritonFusedMoEExecutor({"impl": "triton", "config_dir": str(tmp_path)}).apply(*args)
    torch.testing.assert_close(out, EagerMoEExecutor().apply(*args), atol=1e-5, rtol=1e-5)


def test_table_of_another_triton_version_is_used(tmp_path):
    name = config_file_name(4, 16, torch.float16, "cpu", "0.1")
    (tmp_path / name).write_text(json.dumps({"8": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2)}))
    assert ConfigTable(str(tmp_path)).pick(1, 4, 16, 1, torch.float16, torch.device("cpu"))["BLOCK_M"] == 32


def test_malformed_table_and_bad_options_say_what_to_do(tmp_path):
    (tmp_path / config_file_name(4, 16, torch.float32, "cpu", triton_version())).write_text('{"8": {"BLOCK_M": 16}}')
    with pytest.raises(ValueError, match="malformed.*nanocore tune moe"):
        ConfigTable(str(tmp_path)).pick(1, 4, 16, 1, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="impl must be one of"):
        TritonFusedMoEExecutor({"impl": "cuda"})
    with pytest.raises(ValueError, match="unknown option"):
        TritonFusedMoEExecutor({"block_m": 16})
    x, w, ids, w13, w2 = moe_inputs(2, 2, 1, 8, 8)
    with pytest.raises(ValueError, match="eager"):
        TritonFusedMoEExecutor().apply(x, w, ids, w13.double(), w2)


def test_supports_explains_cpu():
    reason = TritonFusedMoEExecutor.supports(torch.device("cpu"))
    assert "GPU" in reason and "eager" in reason
    assert TritonFusedMoEExecutor.supports_cuda_graph


def test_no_tokens_gives_empty_output():
    x, w, ids, w13, w2 = moe_inputs(1, 2, 1, 8, 8)
    out = TritonFusedMoEExecutor({"impl": "triton"}).apply(x[:0], w[:0], ids[:0], w13, w2)
    assert out.shape == (0, 8)
