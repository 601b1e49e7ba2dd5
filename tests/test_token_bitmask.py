"""toolkit.token_bitmask: packing matches xgrammar's layout bit for bit; applying masks matches a plain reference."""
from __future__ import annotations

import pytest
import torch

from nanocore.toolkit.token_bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_,
    bitmask_words,
    fill_bitmask_row,
    pack_bitmask,
    unpack_bitmask,
)


def random_allowed(batch: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(batch, vocab, generator=gen) < 0.3


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 151_936])
def test_pack_unpack_round_trip_and_layout(vocab):
    allowed = random_allowed(3, vocab, vocab)
    packed = pack_bitmask(allowed)
    assert packed.dtype == torch.int32 and packed.shape == (3, bitmask_words(vocab))
    assert torch.equal(unpack_bitmask(packed, vocab), allowed)
    token = int(allowed[1].nonzero()[0]) if allowed[1].any() else None
    if token is not None:  # token t is bit t % 32 of word t // 32
        assert (int(packed[1, token // 32]) >> (token % 32)) & 1 == 1


def test_allocate_allows_everything_and_fill_row_sets_exactly_the_ids():
    mask = allocate_token_bitmask(2, 70)
    assert unpack_bitmask(mask, 70).all()
    fill_bitmask_row(mask, 1, [0, 31, 32, 69], 70)
    assert unpack_bitmask(mask[1], 70).nonzero().flatten().tolist() == [0, 31, 32, 69]
    assert unpack_bitmask(mask[0], 70).all()


def reference_apply(logits, allowed, indices=None):
    expected = logits.clone()
    rows = range(len(allowed)) if indices is None else indices
    for i, row in enumerate(rows):
        expected[row][~allowed[i]] = float("-inf")
    return expected


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab, mask_vocab", [(1000, 1000), (1003, 1000), (151_936, 151_936)])
def test_apply_matches_the_reference(device, dtype, vocab, mask_vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4, vocab, generator=gen).to(dtype)
    allowed = random_allowed(4, mask_vocab, 1)
    padded = torch.zeros(4, vocab, dtype=torch.bool)
    padded[:, :min(vocab, bitmask_words(mask_vocab) * 32)] = unpack_bitmask(pack_bitmask(allowed), vocab)[:, :vocab]
    expected = reference_apply(logits, padded)
    actual = logits.to(device)
    apply_token_bitmask_(actual, pack_bitmask(allowed))
    assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_apply_to_some_rows_by_index(device):
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(3))
    allowed = random_allowed(2, 500, 4)
    expected = reference_apply(logits, allowed, indices=[4, 1])
    actual = logits.to(device)
    apply_token_bitmask_(actual, pack_bitmask(allowed), indices=torch.tensor([4, 1]))
    assert torch.equal(actual.cpu(), expected)


def test_bad_shapes_say_what_to_pass():
    with pytest.raises(ValueError, match="pass `indices`"):
        apply_token_bitmask_(torch.zeros(3, 64), allocate_token_bitmask(2, 64))
    with pytest.raises(ValueError, match="int32 bitmask"):
        apply_token_bitmask_(torch.zeros(3, 64), torch.zeros(3, 2, dtype=torch.int64))
