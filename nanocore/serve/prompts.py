"""Prompts to token ids for the server: off the event loop, with the context checked before the costly work.

Tokenizing and chat templating run on a small thread pool. A fast (Rust) tokenizer releases the GIL while it
encodes a batch. Measured on the default model's tokenizer, 2 MB of text on a worker thread: through
``tokenizer.encode`` ~7 s with the event loop's longest pause 0.2-0.5 s (offsets and the result are built under
the GIL); through the backend's ``encode_batch_fast`` (no offsets) ~4 s with pauses of ~65 ms, so that is used
where it gives the same ids. On the event loop either would stall every request for the whole time. Before a
text is encoded, a cheap lower bound on its token count (its length over the most characters one token
covers) rejects what cannot fit.
"""
from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nanocore.serve.protocol import bad_request, check_unicode

TOKENIZE_THREADS = 4  # more would only share the same cores; a pool bounds what one burst of requests holds
BOUND_SLACK = 4  # NFC / NFKC compose at most a few characters into one (Hangul L+V+T: three)
SAMPLE = "Hello, world!  12345\n\t<|im_start|> café <s></s> [CLS]"
_KEEPS_TEXT = {"NFC", "NFKC", "Prepend", "Replace", "Sequence", "ByteLevel", "Metaspace", "Split", "Digits",
               "Punctuation"}


def chars_per_token_bound(tokenizer) -> int | None:
    """At most how many prompt characters one token covers, or None for a tokenizer that may drop or fuse text
    (whitespace splitting, WordPiece's [UNK] for a long word): then no bound is used."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec, vocab = json.loads(backend.to_str()), tokenizer.get_vocab()
    except Exception:  # not the tokenizers library's layout: no bound, the prompt is encoded and checked after
        return None
    model = spec.get("model") or {}
    byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
    if model.get("type") != "BPE" or (model.get("fuse_unk") and not model.get("byte_fallback") and not byte_level):
        return None
    if not (_keeps_text(spec.get("normalizer")) and _keeps_text(spec.get("pre_tokenizer"))) or not vocab:
        return None
    return max(map(len, vocab)) * BOUND_SLACK  # a byte-level key has one character per byte it stands for


def fast_encoder(tokenizer):
    """``encode(text, add_special_tokens)`` through the backend without offsets, where it matches ``tokenizer``
    (no truncation or padding set on the backend, same ids on a sample with and without special tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    batch = getattr(backend, "encode_batch_fast", None)
    if batch is None or getattr(backend, "truncation", None) or getattr(backend, "padding", None):
        return None

    def encode(text: str, add_special_tokens: bool) -> list[int]:
        return batch([text], add_special_tokens=add_special_tokens)[0].ids

    try:
        same = all(encode(SAMPLE, flag) == tokenizer.encode(SAMPLE, add_special_tokens=flag) for flag in (True, False))
    except Exception:  # a wrapper that takes other arguments: its own encode is used
        return None
    return encode if same else None


def _keeps_text(node: dict | None) -> bool:
    if node is None:
        return True
    kind = node.get("type")
    if kind not in _KEEPS_TEXT:
        return False
    if kind == "Sequence":
        return all(_keeps_text(n) for n in node.get("normalizers", node.get("pretokenizers", [])))
    if kind in ("Split", "Punctuation"):
        return node.get("behavior") != "Removed"
    if kind == "Replace":
        pattern = node.get("pattern") or {}
        return "String" in pattern and len(node.get("content", "")) >= len(pattern["String"])
    return True


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file holding a Jinja chat template, or the template text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template; give the path of a "
                     f"template file or the template text")


class PromptPreparer:
    """Completion prompts and chat conversations to token ids, checked against ``max_model_len``.
    ``chat_template``: the template text chat requests use instead of the tokenizer's own."""

    def __init__(self, tokenizer, max_model_len: int, vocab_size: int | None, chat_template: str | None = None):
        self.tokenizer, self.max_model_len, self.vocab_size = tokenizer, max_model_len, vocab_size
        self.chat_template = chat_template
        self.max_chars_per_token = chars_per_token_bound(tokenizer)
        self._encode = fast_encoder(tokenizer)
        self.executor = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="nanocore-tokenize")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def completion_prompts(self, prompts: list[str | list[int]], max_tokens: int | None,
                                 add_special_tokens: bool = True) -> list[list[int]]:
        for prompt in prompts:
            if isinstance(prompt, str):
                self.check_bound(len(prompt), max_tokens, "prompt")
        if any(isinstance(p, str) for p in prompts):
            prompts = await self.off_loop(self._encode_all, prompts, add_special_tokens)
        for token_ids in prompts:
            self.check_context(len(token_ids), max_tokens, "prompt")
        return prompts

    def _encode_all(self, prompts: list[str | list[int]], add_special_tokens: bool) -> list[list[int]]:
        return [self.encode(p, add_special_tokens, "prompt") if isinstance(p, str) else p for p in prompts]

    def encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        check_unicode(text, param)
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer; pass prompts as lists of token ids", param)
        try:
            if self._encode is not None:
                return self._encode(text, add_special_tokens)
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        except ValueError as exc:
            raise bad_request(f"{exc}", param) from None

    @property
    def template_text(self) -> str | None:
        """The chat template in use (``--chat-template``, else the tokenizer's)."""
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        return None if template is None else str(template)

    async def chat_prompt(self, messages: list[dict[str, Any]], max_tokens: int | None,
                          add_generation_prompt: bool, chat_template_kwargs: dict | None,
                          add_special_tokens: bool = False, tools: list[dict] | None = None) -> list[int]:
        token_ids = await self.off_loop(self._render_and_encode, messages, max_tokens, add_generation_prompt,
                                         chat_template_kwargs, add_special_tokens, tools)
        self.check_context(len(token_ids), max_tokens, "messages")
        return token_ids

    def _render_and_encode(self, messages, max_tokens, add_generation_prompt, chat_template_kwargs,
                           add_special_tokens, tools) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt, chat_template_kwargs, tools)
        self.check_bound(len(text), max_tokens, "messages")
        return self.encode(text, add_special_tokens, "messages")

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                    chat_template_kwargs: dict | None, tools: list[dict] | None = None) -> str:
        """The conversation as the chat template writes it; ``tools`` (OpenAI's list) are passed to the template."""
        tokenizer = self.tokenizer
        if tokenizer is None or not self.template_text:
            raise bad_request("this model's tokenizer has no chat template; start the server with --chat-template "
                              "or use /v1/completions with plain prompts", "messages")
        options = dict(chat_template_kwargs or {})
        if self.chat_template is not None:
            options["chat_template"] = self.chat_template
        if tools is not None:
            options["tools"] = tools
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                 **options)
        except Exception as exc:  # a template that rejects these messages (roles, order)
            raise bad_request(f"the chat template rejected these messages: {exc}", "messages") from None

    def check_bound(self, num_chars: int, max_tokens: int | None, param: str) -> None:
        """Reject a text that has too many tokens to fit, judged from its length alone (nothing is encoded)."""
        if self.max_chars_per_token is not None:
            self.check_context(-(-num_chars // self.max_chars_per_token), max_tokens, param, at_least=True)

    def check_context(self, num_prompt_tokens: int, max_tokens: int | None, param: str,
                      at_least: bool = False) -> None:
        limit, at = self.max_model_len, "at least " if at_least else ""
        if num_prompt_tokens >= limit:
            raise bad_request(f"this model's maximum context length is {limit} tokens (max_model_len, prompt and "
                              f"output together), but the prompt has {at}{num_prompt_tokens} tokens; shorten it",
                              param)
        if max_tokens is not None and num_prompt_tokens + max_tokens > limit:
            raise bad_request(f"this model's maximum context length is {limit} tokens (max_model_len), but "
                              f"{at}{num_prompt_tokens + max_tokens} were requested: {at}{num_prompt_tokens} in "
                              f"the prompt and {max_tokens} in the completion (max_tokens); shorten the prompt or "
                              f"lower max_tokens", "max_tokens")

    async def detokenize(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer, so token ids cannot become text", "tokens")
        vocab = self.vocab_size or getattr(self.tokenizer, "vocab_size", None)
        if vocab and not all(0 <= t < vocab for t in token_ids):
            raise bad_request(f"token ids must be in [0, {vocab}) for this model", "tokens")
        try:
            return await self.off_loop(self.tokenizer.decode, token_ids)
        except (ValueError, TypeError, IndexError, OverflowError) as exc:  # an id the tokenizer has no text for
            raise bad_request(f"the tokenizer cannot decode these token ids: {exc}", "tokens") from None

    def echo_texts(self, prompts: list[str | list[int]], token_ids: list[list[int]]) -> list[tuple[str, str]]:
        """(text, first token's text) of each prompt, for echo: a text prompt as sent, token ids decoded."""
        if self.tokenizer is None:  # token ids only: no text, and tokens named as the logprobs name them
            return [("", f"token_id:{ids[0]}") for ids in token_ids]
        decode = self.tokenizer.decode
        return [(p if isinstance(p, str) else decode(p), decode(ids[:1])) for p, ids in zip(prompts, token_ids)]

    def token_strs(self, token_ids: list[int]) -> list[str]:
        """Each token's own text (its vocabulary entry where the tokenizer has one)."""
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        if convert is not None:
            return convert(token_ids)
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]
