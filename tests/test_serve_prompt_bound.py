"""The length bound that refuses a prompt before it is tokenized is a true lower bound, and only where it holds."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from nanocore.serve.prompts import chars_per_token_bound, fast_encoder


def byte_level_bpe(normalizer=None) -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "a")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = Tokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_the_bound_holds_on_random_text():
    tokenizer = byte_level_bpe(normalizers.NFC())
    bound = chars_per_token_bound(tokenizer)
    assert bound is not None
    rng = random.Random(0)
    alphabet = "abc \n\té\u0301한\u1100\u1161\u11a8😀"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300)))
        assert len(tokenizer.encode(text)) >= -(-len(text) // bound), text


@pytest.mark.parametrize("build", [
    lambda: Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")),  # one [UNK] for a whole word
    lambda: _with(Tokenizer(models.BPE({"a": 0}, [])), pre_tokenizers.Whitespace()),  # drops the spaces
])
def test_no_bound_where_the_tokenizer_may_drop_or_fuse_text(build):
    assert chars_per_token_bound(PreTrainedTokenizerFast(tokenizer_object=build())) is None


def _with(backend: Tokenizer, pre_tokenizer) -> Tokenizer:
    backend.pre_tokenizer = pre_tokenizer
    return backend


def test_the_fast_encoder_matches_the_tokenizer_or_is_not_used():
    tokenizer = byte_level_bpe()
    encode = fast_encoder(tokenizer)
    assert encode is not None and encode("abc abc", True) == tokenizer.encode("abc abc")
    tokenizer.backend_tokenizer.enable_truncation(max_length=4)  # the backend would cut what the wrapper keeps
    assert fast_encoder(tokenizer) is None
    assert chars_per_token_bound(object()) is None and fast_encoder(object()) is None
