"""Tensor / expert parallelism through LLMEngine on CPU (gloo, spawned workers) against TP=1 / EP=1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from thread_fixtures import one_thread  # noqa: E402,F401 (autouse)
from model_fixtures import make_checkpoint  # noqa: E402
from test_moe_models import make_moe_checkpoint  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.runner.worker_process import WorkerError  # noqa: E402
from nanocore.plugins import get_registry  # noqa: E402

PROMPTS = [[5, 17, 200, 3, 99, 42, 7, 150, 249], [8, 1, 77], list(range(30, 60))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SMALL = dict(device="cpu", block_size=4, num_kv_blocks=96)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen2") / "qwen2", "qwen2", vocab_size=250)  # GQA, odd vocab


def run(llm: LLM, params: SamplingParams = GREEDY):
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], outs


def reference(model: Path, **config):
    llm = LLM(str(model), **SMALL, **config)
    tokens, _ = run(llm)
    return tokens, llm.engine.prompt_logits(PROMPTS[0])


def test_tp2_equals_tp1_then_a_dead_worker_is_a_clear_error(qwen2):
    ref_tokens, ref_logits = reference(qwen2)
    with_logprobs = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3)
    ref_lps = [o.outputs[0].cumulative_logprob for o in LLM(str(qwen2), **SMALL).generate(PROMPTS, with_logprobs,
                                                                                             use_tqdm=False)]
    llm = LLM(str(qwen2), tensor_parallel_size=2, device="cpu", block_size=4, cpu_kv_cache_gib=0.002)
    try:
        assert llm.engine.executor.worker_num_blocks == [llm.engine.runner.num_blocks]
        assert run(llm)[0] == ref_tokens
        torch.testing.assert_close(llm.engine.prompt_logits(PROMPTS[0]), ref_logits, atol=1e-5, rtol=1e-5)
        lps = [o.outputs[0].cumulative_logprob for o in llm.generate(PROMPTS, with_logprobs, use_tqdm=False)]
        assert lps == pytest.approx(ref_lps, abs=1e-4)
        os.kill(llm.engine.executor.procs[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="rank 1 failed while running a step.*killed by signal 9"):
            run(llm)
        with pytest.raises(WorkerError):  # and it stays an error, never a hang
            run(llm)
    finally:
        llm.close()
    assert not any(p.is_alive() for p in llm.engine.executor.procs)


def test_backends_chosen_by_name_load_in_workers(qwen2):
    """int8 KV codec (a plugin) on every rank and the hash prefix cache on rank 0, TP=2 vs TP=1."""
    config = dict(kv_codec="int8", prefix_cache="hash")
    ref_tokens, ref_logits = reference(qwen2, **config)
    llm = LLM(str(qwen2), tensor_parallel_size=2, **SMALL, **config)
    try:
        assert type(llm.engine.runner.codec).__module__.startswith("nanocore_kv_quant")
        assert llm.engine.executor.worker_backends == [{"linear_method": "unquantized", "kv_codec": "int8",
                                                       "moe_executor": None}]
        assert run(llm)[0] == ref_tokens
        assert run(llm)[0] == ref_tokens  # second time through the prefix cache
        assert llm.stats().num_cached_tokens > 0
        torch.testing.assert_close(llm.engine.prompt_logits(PROMPTS[0]), ref_logits, atol=1e-4, rtol=1e-4)
    finally:
        llm.close()


@pytest.mark.parametrize("kind,tp,ep", [("qwen2_moe", 1, 2), ("qwen3_moe", 1, 2), ("qwen3_moe", 2, 2)])
def test_expert_parallel_equals_ep1(tmp_path, kind, tp, ep):
    ckpt = make_moe_checkpoint(tmp_path / kind, kind)
    ref_tokens, ref_logits = reference(ckpt)
    llm = LLM(str(ckpt), tensor_parallel_size=tp, expert_parallel_size=ep, **SMALL)
    try:
        assert run(llm)[0] == ref_tokens
        torch.testing.assert_close(llm.engine.prompt_logits(PROMPTS[0]), ref_logits, atol=1e-5, rtol=1e-5)
    finally:
        llm.close()


def test_kv_block_count_is_the_minimum_over_ranks(tmp_path):
    script = Path(__file__).parent / "tp_min_worker.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["7", "7"]


def test_worker_that_fails_to_start_is_a_clear_error(qwen2, monkeypatch):
    """The plugin is loaded here but not in the workers (they load from entry points, under this env)."""
    get_registry()
    monkeypatch.setenv("NANOCORE_DISABLE_PLUGINS", "nanocore-kv-quant")
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"(?s)rank 1 failed while loading plugins.*unknown kv_codec 'int8'.*entry points"):
        LLM(str(qwen2), tensor_parallel_size=2, kv_codec="int8", **SMALL)
    assert time.monotonic() - start < 60


def test_bad_parallel_configs_fail_before_starting_workers(qwen2):
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        LLM(str(qwen2), expert_parallel_size=2, **SMALL)
    with pytest.raises(ValueError, match="must divide one another"):
        LLM(str(qwen2), tensor_parallel_size=2, expert_parallel_size=3, **SMALL)
    heads = json.loads((qwen2 / "config.json").read_text())["num_attention_heads"]
    with pytest.raises(ValueError, match=f"cannot be split.*num_attention_heads {heads} is not divisible by 3"):
        LLM(str(qwen2), tensor_parallel_size=3, **SMALL)  # before: workers started, then the layers refused


def test_sharding_problems_name_every_size_a_layout_must_divide():
    from types import SimpleNamespace

    from nanocore.runner.parallel_checks import sharding_problems

    moe = SimpleNamespace(num_attention_heads=16, num_key_value_heads=4, num_experts=60, moe_intermediate_size=1408)
    assert sharding_problems(moe, 2, 1) == [] and sharding_problems(moe, 8, 1) == []  # 8 ranks replicate 4 KV heads
    assert sharding_problems(moe, 4, 4) == []
    assert sharding_problems(moe, 2, 8) == ["num_experts 60 is not divisible by expert_parallel_size 8"]
    assert sharding_problems(moe, 6, 1)[0] == "num_attention_heads 16 is not divisible by 6"
