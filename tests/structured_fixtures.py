"""A tiny random checkpoint with a real byte-level tokenizer, for structured-output tests through the loader."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint  # noqa: E402

SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: the checkpoint's pad, bos and eos
VOCAB_SIZE = len(SPECIALS) + 256  # one token per byte after the specials


def save_byte_tokenizer(path: Path) -> None:
    """GPT-2's byte-level pieces with no merges: every byte is one token (ids 3..258)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from nanocore.toolkit.vocabulary import byte_level_decoder

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for piece, _ in sorted(byte_level_decoder().items(), key=lambda item: item[1]):
        vocab[piece] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>")
    fast.save_pretrained(path)


def byte_model(path: Path) -> Path:
    """A random tiny Qwen2 checkpoint (4 heads, 2 KV heads: splits over 2 ranks) with the byte tokenizer."""
    make_checkpoint(path, "qwen2", vocab_size=VOCAB_SIZE)
    save_byte_tokenizer(path)
    return path
