"""The issue-17 decode probes (GPU diagnostics in benchmarks/) compute what they claim, in the Triton interpreter at a
small shape: the word read probe's integer sums are exact, and every ladder stage matches its torch reference."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from benchmarks import decode_ladder_probe as ladder  # noqa: E402
from benchmarks import decode_read_probe as reader  # noqa: E402


@pytest.fixture
def small(monkeypatch):
    for mod in (ladder, reader):
        monkeypatch.setattr(mod, "SEQS", 2)
        monkeypatch.setattr(mod, "CTX", 64)
        monkeypatch.setattr(mod, "KV_HEADS", 2)


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_word_probe_sums_every_byte_exactly(small, dtype, head_major):
    pages = reader.SEQS * reader.CTX // reader.PAGE
    shape = (pages, 2, reader.PAGE, reader.HEAD_DIM) if head_major else (pages, reader.PAGE, 2, reader.HEAD_DIM)
    torch.manual_seed(0)
    k, v = (torch.randint(-100, 100, shape, dtype=torch.int8).to(dtype) for _ in range(2))
    if head_major:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    tables = torch.randperm(pages, dtype=torch.int32).view(reader.SEQS, -1)
    want = (k.view(torch.int32).long().sum() + v.view(torch.int32).long().sum()).item() % 2**32
    got = reader.run_words(k, v, tables, heads=1, block_n=16, warps=1, splits=2, stages=1)
    assert got.long().sum().item() % 2**32 == want
    got[0] += 1  # the comparison sees a one-word difference
    assert got.long().sum().item() % 2**32 != want


@pytest.mark.parametrize("is_int8", [True, False])
@pytest.mark.parametrize("level", list(ladder.LEVELS))
def test_ladder_stage_matches_torch(small, is_int8, level):
    q, k, v, tables = ladder.case(is_int8, "cpu")
    lv = ladder.LEVELS[level]
    got = ladder.combine(*ladder.run(q, k, v, tables, lv, 16, 1, 2, 1, 0), lv)  # CVT 0: the interpreter's conversion
    want = ladder.reference(q, k, v, tables, lv)
    assert ((got - want).norm() / want.norm()).item() < 1e-3
    if level == "byte_qk":  # quantizing Q moves the result, but not by much
        fp16_q = ladder.reference(q, k, v, tables, ladder.LEVELS["dots"])
        assert 0 < ((got - fp16_q).norm() / fp16_q.norm()).item() < 3e-2
