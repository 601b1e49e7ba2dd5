"""xgrammar against nanocore's own pieces: its mask application, a real tokenizer's vocabulary, the options."""
from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr

from nanocore.interfaces import Constraint
from nanocore.toolkit.token_bitmask import apply_token_bitmask_, pack_bitmask, unpack_bitmask
from nanocore_xgrammar import XGrammarStructuredOutput


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("vocab", [1000, 151_936])
def test_toolkit_apply_matches_xgrammars_kernel(device, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    bitmask = pack_bitmask(torch.rand(5, vocab, generator=gen) < 0.4)
    expected = logits.clone().to(device)
    xgr.apply_token_bitmask_inplace(expected, bitmask.to(device))
    actual = logits.clone().to(device)
    apply_token_bitmask_(actual, bitmask)
    assert torch.equal(actual.cpu(), expected.cpu())


@pytest.fixture(scope="module")
def smollm2_vocabulary():
    from transformers import AutoTokenizer

    from nanocore.toolkit.vocabulary import token_vocabulary

    loader = pytest.importorskip("nanocore.loader.default_model", reason="the default model's loader")
    tokenizer = AutoTokenizer.from_pretrained(loader.default_model_path())
    return tokenizer, token_vocabulary(tokenizer)


def test_a_real_tokenizer_generates_valid_json(smollm2_vocabulary):
    """SmolLM2's byte-level vocabulary: sample by random masked logits and check the decoded text."""
    tokenizer, vocabulary = smollm2_vocabulary
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["city", "n"], "additionalProperties": False}
    backend = XGrammarStructuredOutput(vocabulary)
    compiled = backend.compile(Constraint.json_schema(schema))
    closing = torch.tensor([b[-1:] in (b'"', b"}") for b in vocabulary.token_bytes] + [False] * (
        vocabulary.vocab_size - len(vocabulary.token_bytes))) * 2.0
    closing[tokenizer.eos_token_id] = 5.0
    for seed in range(3):
        matcher, gen, tokens = backend.matcher(compiled), torch.Generator().manual_seed(seed), []
        bitmask = torch.zeros(1, vocabulary.bitmask_words, dtype=torch.int32)
        while not matcher.is_terminated() and len(tokens) < 200:
            matcher.fill_bitmask(bitmask)
            allowed = unpack_bitmask(bitmask[0], vocabulary.vocab_size)
            scores = torch.rand(vocabulary.vocab_size, generator=gen) + (len(tokens) > 12) * closing
            token = int(scores.masked_fill(~allowed, -1).argmax())
            assert matcher.accept_token(token)
            tokens.append(token)
        assert matcher.is_terminated(), f"seed {seed}: no end after 200 tokens"
        value = json.loads(tokenizer.decode(tokens[:-1]))
        assert set(value) == {"city", "n"} and isinstance(value["n"], int)


def test_options_are_checked_and_reach_xgrammar():
    from nanocore_conformance.structured_output_cases import test_vocabulary

    vocabulary = test_vocabulary()
    with pytest.raises(ValueError, match="option 'any_whitespace' must be bool"):
        XGrammarStructuredOutput(vocabulary, {"any_whitespace": "no"})
    tight = XGrammarStructuredOutput(vocabulary, {"any_whitespace": False, "max_threads": 1})
    matcher = tight.matcher(tight.compile(Constraint("json_object")))
    assert matcher.accept_token(vocabulary.token_bytes.index(b"{"))
    assert not matcher.accept_token(vocabulary.token_bytes.index(b" "))  # no free whitespace
