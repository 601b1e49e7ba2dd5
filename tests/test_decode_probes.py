"""The issue-17 decode probes (GPU diagnostics in benchmarks/) compute what they claim, in the Triton interpreter at a
small shape whose last tile is partial and whose last split is empty: the read probe's per-(sequence, head group)
sums match a torch gather through the block tables, and every ladder stage matches its torch reference."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from benchmarks import decode_ladder_probe as ladder  # noqa: E402
from benchmarks import decode_probe_shape as shape  # noqa: E402
from benchmarks import decode_read_probe as reader  # noqa: E402


@pytest.fixture(autouse=True)
def small(monkeypatch):
    monkeypatch.setattr(shape, "SEQS", 2)
    monkeypatch.setattr(shape, "CTX", 48)  # 32-key tiles: the second one half masked; 3 splits: the last one empty
    monkeypatch.setattr(shape, "KV_HEADS", 4)


@pytest.mark.parametrize("words", [True, False])
@pytest.mark.parametrize("head_major, heads", [(False, 1), (False, 2), (True, 1)])  # head-major: one head per run
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_read_probe_sums_each_sequence_and_group(dtype, head_major, heads, words):
    k, v, tables = reader.case(dtype, head_major, device="cpu")
    want = reader.reference(k, v, tables, heads, words)
    out = reader.run(k, v, tables, heads, block_n=32, warps=1, splits=3, words=words)
    assert reader.check(out, want, words) < 1e-12
    bad_tables = tables.flip(0)  # each sequence read through the other's table: the total is the same, the sums not
    assert reader.check(reader.run(k, v, bad_tables, heads, 32, 1, 3, words), want, words) > 1e-6


@pytest.mark.parametrize("is_int8", [True, False])
@pytest.mark.parametrize("level", list(ladder.LEVELS))
def test_ladder_stage_matches_torch(is_int8, level):
    q, k, v, tables = ladder.case(is_int8, "cpu")
    lv = ladder.LEVELS[level]
    got = ladder.combine(*ladder.run(q, k, v, tables, lv, 32, 1, 3, 1, 0), lv)  # CVT 0: the interpreter's conversion
    want = ladder.reference(q, k, v, tables, lv)
    assert ((got - want).norm() / want.norm()).item() < 1e-3
    if level == "byte_qk":  # quantizing Q moves the result, but not by much
        fp16_q = ladder.reference(q, k, v, tables, ladder.LEVELS["dots"])
        assert ((got - fp16_q).norm() / fp16_q.norm()).item() < 5e-2
