"""The engine on a GPU: CUDA-graph decode equals eager decode, GPU greedy equals the CPU engine's until a
near-tie, and the KV cache is sized by profiling. Runs on the GPU machine; skips without CUDA."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib

pytestmark = pytest.mark.cuda
NEAR_TIE = 1e-2  # logprob gap under which fp32 GPU and CPU kernels may legitimately pick different tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from model_fixtures import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("gpu") / "llama", "llama", hidden_size=256, intermediate_size=512,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=512, num_hidden_layers=3)


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    """Qwen3: per-head q / k RMSNorm, fused into the RoPE kernel on the GPU (the CPU runs the torch twins)."""
    from model_fixtures import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("gpu") / "qwen3", "qwen3", hidden_size=256, intermediate_size=512,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=512, num_hidden_layers=3)


PROMPTS = [[(7 * i + 3 * j) % 500 + 1 for j in range(5 + 3 * i)] for i in range(6)]


def greedy(llm, max_tokens=32, logprobs=None):
    from nanocore import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    return llm.generate(PROMPTS, params, use_tqdm=False)


def test_cuda_graph_decode_equals_eager(checkpoint):
    from nanocore import LLM
    outputs = {}
    for eager in (True, False):
        llm = LLM(str(checkpoint), device="cuda", dtype="float32", enforce_eager=eager, max_num_seqs=16,
                  num_kv_blocks=256)
        assert (llm.engine.runner.decode_graphs is None) == eager
        outputs[eager] = [o.outputs[0].token_ids for o in greedy(llm)]
        del llm
    assert outputs[True] == outputs[False]


def test_piecewise_graphs_for_prefill_chunks_equal_eager(checkpoint):
    """Steps with prefill chunks replayed as piecewise graphs (attention eager between segments) give the eager
    engine's tokens; small max_num_batched_tokens makes most steps mixed (chunks beside decodes)."""
    from nanocore import LLM
    outputs = {}
    for mixed in (False, True):
        llm = LLM(str(checkpoint), device="cuda", dtype="float32", enforce_eager=not mixed, cuda_graph_mixed=mixed,
                  max_num_seqs=16, max_num_batched_tokens=24, num_kv_blocks=256)
        runner = llm.engine.runner
        assert (runner.mixed_graphs is not None) == mixed
        replays = []
        if mixed:  # count the steps that really replayed segments
            run = runner.mixed_graphs.run
            runner.mixed_graphs.run = lambda *a: replays.append(a[0].shape[0]) or run(*a)
        outputs[mixed] = [o.outputs[0].token_ids for o in greedy(llm)]
        assert bool(replays) == mixed, replays
        del llm
    assert outputs[True] == outputs[False]


@pytest.mark.parametrize("model", ["checkpoint", "qwen3_checkpoint"])
def test_gpu_greedy_equals_cpu_until_a_near_tie(model, request):
    from nanocore import LLM
    checkpoint = request.getfixturevalue(model)
    cpu = greedy(LLM(str(checkpoint), device="cpu", num_kv_blocks=256), logprobs=2)
    gpu = greedy(LLM(str(checkpoint), device="cuda", dtype="float32", num_kv_blocks=256))
    for c, g in zip(cpu, gpu):
        ct, gt = c.outputs[0].token_ids, g.outputs[0].token_ids
        diverge = next((i for i, (a, b) in enumerate(zip(ct, gt)) if a != b), None)
        if diverge is not None:
            top = sorted((lp.logprob for lp in c.outputs[0].logprobs[diverge].values()), reverse=True)
            assert top[0] - top[1] < NEAR_TIE, f"GPU diverged at token {diverge} without a near-tie"


def test_kv_cache_is_sized_by_profiling(checkpoint):
    from nanocore import LLM
    total = torch.cuda.mem_get_info()[1]
    llm = LLM(str(checkpoint), device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True)
    runner = llm.engine.runner
    kv_bytes = runner.num_blocks * runner.bytes_per_block
    assert runner.capacity_tokens > 0
    assert kv_bytes <= 0.3 * total
    assert kv_bytes > 0.2 * total  # a tiny model leaves almost the whole budget to the cache
