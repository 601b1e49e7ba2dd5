"""``LLM``: the offline API, mirroring vLLM's (``generate``, ``chat``) plus ``stream`` and ``stats``."""
from __future__ import annotations

import logging
import time
from typing import Any, Iterator, Sequence as Seq

from tqdm.auto import tqdm

from nanocore.config import EngineConfig
from nanocore.engine.detokenizer import chat_prompt_ids
from nanocore.runner.heap import frozen_heap
from nanocore.engine.llm_engine import LLMEngine
from nanocore.engine.outputs import EngineStats, RequestOutput
from nanocore.engine.sampling_params import SamplingParams

logger = logging.getLogger("nanocore")

Prompt = str | list[int]
Conversation = list[dict[str, Any]]


class LLM:
    """``LLM(model="default", **engine_config_fields)``; fields as in ``EngineConfig`` (NANOCORE_* env applies). A bad
    field raises ``nanocore.config.ConfigError`` (a ValueError) with one line per problem."""

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, loaded_model=None,
                 **config_fields: Any):
        if config is None:
            config = EngineConfig.load(model=model, **config_fields)
        elif model is not None or config_fields:  # validated like any keywords; the environment was applied already
            config = EngineConfig.load(environ={}, **{**config.model_dump(exclude_unset=True),
                                                      "model": model or config.model, **config_fields})
        self.config = config
        self.engine = LLMEngine(config, loaded_model=loaded_model)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> EngineStats:
        return self.engine.get_stats()

    def close(self) -> None:
        """Stop tensor / expert-parallel worker processes (also done when the LLM is collected or at exit)."""
        self.engine.close()

    # ---- batch generation ----------------------------------------------------------------
    def generate(self, prompts: str | Seq[str] | Seq[int] | Seq[Seq[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (text or token-id lists); outputs come back in prompt order."""
        prompt_list = normalize_prompts(prompts)
        params_list = normalize_params(sampling_params, len(prompt_list))
        ids: list[str] = []
        clamped: list[tuple[int, int]] = []  # (prompt tokens, max_tokens) of requests that the context cuts short
        with frozen_heap():  # from the first request on: no full GC scan of the model's heap mid-batch
            try:
                for prompt, params in zip(prompt_list, params_list):
                    request = self.engine.add_request(prompt, params)
                    ids.append(request.request_id)
                    num_prompt = len(request.prompt_token_ids)
                    if params.max_tokens and num_prompt + params.max_tokens > self.engine.max_model_len:
                        clamped.append((num_prompt, params.max_tokens))
            except BaseException:  # one bad prompt: drop the ones queued before it, or they run unseen later
                for request_id in ids:
                    self.engine.abort_request(request_id)
                raise
            if clamped:
                say_clamped(clamped, self.engine.max_model_len)
            return self._run(ids, use_tqdm)

    def chat(self, messages: Conversation | list[Conversation],
             sampling_params: SamplingParams | Seq[SamplingParams] | None = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the tokenizer's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.apply_chat_template(c, add_generation_prompt, chat_template_kwargs) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(self, conversation: Conversation, add_generation_prompt: bool = True,
                            chat_template_kwargs: dict | None = None) -> list[int]:
        return chat_prompt_ids(self.engine.tokenizer, conversation, add_generation_prompt, chat_template_kwargs)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Generating", unit="req", disable=not use_tqdm or len(request_ids) < 2,
                   dynamic_ncols=True)
        start, generated_before = time.perf_counter(), self.engine.stats.num_generated_tokens
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    results[output.request_id] = output
                    bar.update(1)
                elapsed = time.perf_counter() - start
                bar.set_postfix_str(f"{(self.engine.stats.num_generated_tokens - generated_before) / elapsed:.1f} out tok/s",
                                    refresh=False)
        except BaseException:
            for request_id in request_ids:
                self.engine.abort_request(request_id)
            raise
        finally:
            bar.close()
        return [results[r] for r in request_ids if r in results]

    # ---- streaming -----------------------------------------------------------------------
    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the completion's text as it grows (incremental deltas). Needs ``n == 1``."""
        params = normalize_params(sampling_params, 1)[0]
        if params.n != 1:
            raise ValueError(f"stream() produces one completion; got n={params.n}, use generate() for n > 1")
        if self.engine.has_unfinished_requests():
            raise RuntimeError("the engine is busy with other requests; stream() runs one request at a time")
        if self.engine.tokenizer is None:
            raise ValueError("stream() needs a tokenizer to produce text")
        request = self.engine.add_request(prompt, params, stream=True)
        detokenizer = request.detokenizers[0]
        try:
            while not request.finished:
                self.engine.step()
                delta = detokenizer.stream_delta(request.finished)
                if delta:
                    yield delta
        finally:
            if not request.finished:
                self.engine.abort_request(request.request_id)


def say_clamped(clamped: list[tuple[int, int]], max_model_len: int) -> None:
    """Once per call: max_tokens past the context is clamped to it, as vLLM does offline."""
    prompt_tokens, max_tokens = clamped[0]
    others = f" (and {len(clamped) - 1} more requests)" if len(clamped) > 1 else ""
    logger.warning("max_tokens %d with a %d-token prompt is past max_model_len %d: at most %d tokens are generated%s",
                   max_tokens, prompt_tokens, max_model_len, max_model_len - prompt_tokens, others)


def normalize_prompts(prompts) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, dict)) or not hasattr(prompts, "__iter__"):
        raise ValueError(f"prompts must be a string, a list of token ids, or a list of those; "
                         f"got {type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt given as token ids
    for p in prompts:
        if not isinstance(p, str) and not (isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p)):
            raise ValueError(f"each prompt must be a string or a list of token ids, got {type(p).__name__}")
    return [p if isinstance(p, str) else list(p) for p in prompts]


def normalize_params(params, num_prompts: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(params, SamplingParams):
        return [params] * num_prompts
    params = list(params) if hasattr(params, "__iter__") and not isinstance(params, (str, bytes, dict)) else [params]
    if not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError(f"sampling_params must be a SamplingParams or a list of them (one per prompt), "
                         f"got {params!r}; build one with SamplingParams(temperature=..., max_tokens=...)")
    if len(params) != num_prompts:
        raise ValueError(f"got {len(params)} SamplingParams for {num_prompts} prompts; give one, or one per prompt")
    return params
