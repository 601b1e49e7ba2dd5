"""A model's tokens as bytes, for structured-output backends (since 1.5).

``token_vocabulary(tokenizer)`` reads a Hugging Face tokenizer's pieces: byte-level BPE (GPT-2, Llama 3, Qwen,
SmolLM: printable stand-ins for bytes) and SentencePiece (``▁`` for a space, ``<0x0A>`` byte-fallback pieces);
other tokenizers fall back to decoding each id alone. Special tokens become empty (never allowed as text).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from nanocore.interfaces.structured_output import TokenVocabulary

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """GPT-2's map from the printable stand-in character back to the byte it stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


def decoder_type(tokenizer: Any) -> str:
    """'byte_level', 'sentencepiece' or 'other', from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "other"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
    if "ByteLevel" in kinds:
        return "byte_level"
    if "ByteFallback" in kinds or "Metaspace" in kinds or {"Replace", "Fuse"} <= kinds:
        return "sentencepiece"
    return "other"


def piece_bytes(piece: str, kind: str, tokenizer: Any, token_id: int) -> bytes:
    if kind == "byte_level":
        table = byte_level_decoder()
        if all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
    elif kind == "sentencepiece":
        match = _BYTE_PIECE.match(piece)
        return bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode()
    return tokenizer.decode([token_id]).encode()


def token_vocabulary(tokenizer: Any, vocab_size: int | None = None,
                     stop_token_ids: list[int] | tuple[int, ...] | None = None) -> TokenVocabulary:
    """The bytes of every token of ``tokenizer``. ``vocab_size`` is the model's logits width (default: the
    tokenizer's length); ``stop_token_ids`` default to the tokenizer's end-of-sequence token."""
    size = len(tokenizer)
    kind = decoder_type(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", [])) | {
        i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    token_bytes = tuple(b"" if i in special or piece is None else piece_bytes(piece, kind, tokenizer, i)
                        for i, piece in enumerate(pieces))
    if stop_token_ids is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no end-of-sequence token; pass stop_token_ids")
        stop_token_ids = (tokenizer.eos_token_id,)
    vocab_size = vocab_size or size
    return TokenVocabulary(token_bytes[:vocab_size], vocab_size, tuple(stop_token_ids))
