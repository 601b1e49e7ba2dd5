"""The fake-model engines and scenario drivers shared by the async-scheduling tests (test_engine_async*.py)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import EOS, VOCAB, fake_loaded_model  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

BASE = {"device": "cpu", "kv_codec": "unquantized", "block_size": 4}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_llm(async_scheduling: bool, eos_boost: float = 2.5, **fields) -> LLM:
    """The tiny fake model with EOS made likely enough that sampled rows finish at scattered steps."""
    loaded = fake_loaded_model()
    compute_logits = loaded.model.compute_logits

    def eos_likely(hidden):
        logits = compute_logits(hidden)
        logits[:, EOS] += eos_boost
        return logits

    loaded.model.compute_logits = eos_likely
    config = {**BASE, "num_kv_blocks": 256, "prefix_cache": "none", "scheduler_policy": "prefill_first", **fields}
    return LLM("fake", loaded_model=loaded, async_scheduling=async_scheduling, **config)


def drive(llm: LLM, waves: dict[int, list], aborts: dict[int, list[str]] | None = None):
    """Add ``waves[k]`` (prompt, params) before step k, abort ``aborts[k]``; return what finished when."""
    engine, aborts = llm.engine, aborts or {}
    done, step = {}, 0
    while engine.has_unfinished_requests() or any(k >= step for k in waves):
        for prompt, params in waves.get(step, []):
            engine.add_request(prompt, params)
        for request_id in aborts.get(step, []):
            engine.abort_request(request_id)
        for out in engine.step():
            done[out.request_id] = (step, out.num_cached_tokens, [
                (c.token_ids, c.finish_reason, c.stop_reason, c.text) for c in out.outputs])
        step += 1
    return done


def prompts(count: int, seed: int, shared_prefix: str = "") -> list[str]:
    rng = random.Random(seed)
    letters = VOCAB[4:30]
    return [shared_prefix + "".join(rng.choice(letters) for _ in range(rng.randint(1, 14))) for _ in range(count)]


def mixed_params(seed: int) -> list[SamplingParams]:
    """Greedy, unseeded and seeded sampling, top-k, n > 1, stop ids, min_tokens, EOS on or ignored."""
    rng = random.Random(seed)
    out = []
    for i in range(12):
        kind = i % 6
        max_tokens = rng.randint(1, 30)
        if kind == 0:
            out.append(SamplingParams(temperature=0, max_tokens=max_tokens))
        elif kind == 1:
            out.append(SamplingParams(temperature=1.0, max_tokens=max_tokens))
        elif kind == 2:
            out.append(SamplingParams(temperature=0.8, seed=rng.randint(0, 99), max_tokens=max_tokens, n=2))
        elif kind == 3:
            out.append(SamplingParams(temperature=1.0, top_k=5, max_tokens=max_tokens, ignore_eos=True,
                                      stop_token_ids=[VOCAB.index("e"), VOCAB.index("a")]))
        elif kind == 4:
            out.append(SamplingParams(temperature=1.0, n=3, max_tokens=max_tokens, min_tokens=min(4, max_tokens)))
        else:
            out.append(SamplingParams(temperature=0.7, seed=5, max_tokens=max_tokens, ignore_eos=True))
    return out
