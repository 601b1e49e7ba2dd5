"""Incremental detokenization and stop strings, off the model's hot path.

Only new tokens are decoded, with a small window of earlier tokens as context (vLLM's
``detokenize_incrementally``), so the cost per step does not grow with the output. A sequence with no
stop strings that is not streamed is decoded once, when it finishes.
"""
from __future__ import annotations

PROMPT_CONTEXT_TOKENS = 5  # earlier tokens decoded with the new ones so spaces / merges come out right


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 stop: list[str] | None = None, include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop or [])
        self.include_stop = include_stop_str_in_output
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.token_ids = context  # context + output tokens seen so far
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.output_text = ""
        self.num_streamed_chars = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (held back while it ends in a partial character)."""
        self.token_ids.extend(new_token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        delta = full_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.output_text += delta
        return delta

    def check_stop(self, num_new_chars: int) -> str | None:
        """If a stop string appears in the new text, truncate the output there and return it."""
        if not self.stop or not num_new_chars:
            return None
        longest = max(len(s) for s in self.stop)
        search_from = max(0, len(self.output_text) - num_new_chars - longest + 1)
        for stop in self.stop:
            at = self.output_text.find(stop, search_from)
            if at != -1:
                self.output_text = self.output_text[:at + (len(stop) if self.include_stop else 0)]
                return stop
        return None

    def stream_delta(self, finished: bool) -> str:
        """Text not yet streamed; while running, hold back what could still become a stop string."""
        hold = 0 if finished or not self.stop else max(len(s) for s in self.stop) - 1
        end = max(self.num_streamed_chars, len(self.output_text) - hold)
        delta = self.output_text[self.num_streamed_chars:end]
        self.num_streamed_chars = end
        return delta


def decode_output(tokenizer, token_ids: list[int], skip_special_tokens: bool = True) -> str:
    """Decode a finished output at once (sequences without stop strings that are not streamed)."""
    if tokenizer is None:
        return ""
    return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of a text prompt; a clear error for a model without a tokenizer."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer; pass prompts as lists of token ids")
    return tokenizer.encode(prompt)


def chat_prompt_ids(tokenizer, conversation, add_generation_prompt: bool = True,
                    chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids of ``conversation`` through the tokenizer's chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; use generate() with plain prompts")
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **(chat_template_kwargs or {}))
    return tokenizer.encode(text, add_special_tokens=False)
