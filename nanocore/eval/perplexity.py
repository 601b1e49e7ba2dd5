"""Teacher-forced perplexity through the engine's own forward (paged cache, configured codec and linears).

Every window attends through the quantized KV cache (``prompt_logits(kv_from_cache=True)``): a prefill
reads a window's own K/V in the model dtype, never the cache, so it would not measure the codec at all.

Sliding windows as in the Hugging Face perplexity guide: each window of ``window`` tokens starts
``stride`` after the previous one and scores only the tokens the previous windows did not.
"""
from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

LEE_CORPUS = Path("test") / "test_data" / "lee_background.cor"
GENSIM_HINT = "pip install --no-deps gensim"


def default_corpus_path() -> Path:
    """The Lee news corpus inside the installed gensim package (found without importing gensim)."""
    spec = importlib.util.find_spec("gensim")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / LEE_CORPUS
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the default perplexity corpus is gensim's {LEE_CORPUS.as_posix()}; install it with: {GENSIM_HINT} "
        f"(or pass --text FILE)")


@dataclass
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token, nats
    num_tokens: int  # tokens scored
    num_windows: int
    window: int
    stride: int
    seconds: float
    tokens_per_s: float


def window_spans(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, tokens to score at the end of the window) for each window."""
    if window < 2 or not 1 <= stride <= window:
        raise ValueError(f"need window >= 2 and 1 <= stride <= window, got window={window}, stride={stride}")
    spans, prev_end = [], 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + window, num_tokens)
        begin = max(0, end - window)  # a short last window reaches back for context
        num_scored = min(end - prev_end, end - begin - 1)
        if num_scored <= 0:
            break
        spans.append((begin, end, num_scored))
        prev_end = end
        if end == num_tokens:
            break
    return spans


def perplexity(engine, token_ids: list[int], window: int = 512, stride: int = 512,
               progress: bool = False) -> PerplexityResult:
    """Perplexity of ``token_ids`` under ``engine`` (an idle LLMEngine); ``progress``: a bar of windows on stderr."""
    if len(token_ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens of text")
    nll_sum, scored = 0.0, 0
    spans = window_spans(len(token_ids), window, stride)
    start = time.perf_counter()
    for begin, end, num_scored in tqdm(spans, desc="perplexity", unit="window", disable=not progress,
                                       dynamic_ncols=True):
        ids = token_ids[begin:end]
        # through the quantized cache, so the perplexity gates measure the KV codec
        logits = engine.prompt_logits(ids, kv_from_cache=True)[-num_scored - 1:-1].float()
        targets = torch.tensor(ids[-num_scored:], device=logits.device)
        nll_sum += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        scored += num_scored
    seconds = time.perf_counter() - start
    nll = nll_sum / scored
    return PerplexityResult(math.exp(nll), nll, scored, len(spans), window, stride, seconds,
                            sum(e - b for b, e, _ in spans) / seconds)


def load_corpus_tokens(tokenizer, path: Path | None, max_tokens: int | None) -> list[int]:
    if tokenizer is None:
        raise ValueError("perplexity on text needs a model with a tokenizer")
    path = Path(path) if path else default_corpus_path()
    if not path.is_file():
        raise FileNotFoundError(f"text file {path} does not exist")
    ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
    return ids[:max_tokens] if max_tokens else ids


def result_dict(result: PerplexityResult) -> dict:
    return asdict(result)
