"""Piecewise CUDA graphs for steps with prefill chunks (nanocore/runner/piecewise_graphs.py): the token buckets,
which steps may use them, the KV-sizing reserve, and, on CPU, the graphs' plumbing run eagerly (padding to the
bucket, static q/k/v/output buffers, attention on the step's first T rows) against the plain engine."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint  # noqa: E402
from nanocore import LLM, SamplingParams  # noqa: E402
from nanocore.config import EngineConfig  # noqa: E402
from nanocore.runner.kv_sizing import graph_reserve  # noqa: E402
from nanocore.runner.piecewise_graphs import PiecewiseGraphs, mixed_buckets  # noqa: E402

PROMPTS = [[(11 * i + 5 * j) % 500 + 1 for j in range(3 + 29 * i)] for i in range(6)]  # 3 .. 148 tokens


@pytest.mark.parametrize("limit", [16384, 2048, 1000, 64, 5])
def test_buckets_cover_every_step_size_with_bounded_padding(limit):
    buckets = mixed_buckets(limit)
    assert buckets == sorted(set(buckets)) and buckets[-1] == min(limit, 512)
    for t in range(1, buckets[-1] + 1):
        b = next(b for b in buckets if b >= t)
        assert t <= b and (t <= 8 or b <= 1.25 * t + 16), (t, b)


def test_graph_reserve_scales_the_profiled_activations():
    model = torch.nn.Linear(2, 2)  # nothing in it blocks graph capture
    on = EngineConfig(model="x", cuda_graph_mixed=True, max_num_batched_tokens=16384)
    outputs = sum(mixed_buckets(16384)) * 10  # every bucket's output rows stay in the pool (10 bytes a row here)
    assert graph_reserve(EngineConfig(model="x", cuda_graph_mixed=False), model, 16384, 1000, 10) == 0
    assert graph_reserve(on, model, 16384, 16000, 10) == 625 + outputs  # largest bucket 512 of 16,384, 25% slack
    assert graph_reserve(on.model_copy(update={"enforce_eager": True}), model, 16384, 16000, 10) == 0
    small = on.model_copy(update={"max_num_batched_tokens": 1024})
    assert graph_reserve(small, model, 1024, 4000, 10) == 2500 + sum(mixed_buckets(1024)) * 10
    default = EngineConfig(model="x", max_num_batched_tokens=1024)  # on by default with one GPU, off with TP
    assert graph_reserve(default, model, 1024, 4000, 10) == graph_reserve(small, model, 1024, 4000, 10)
    assert graph_reserve(default.model_copy(update={"tensor_parallel_size": 2}), model, 1024, 4000, 10) == 0


def test_no_reserve_when_the_model_cannot_be_captured():
    class Blocked(torch.nn.Module):
        prepare_finalize = type("EP", (), {"cuda_graph_blocker": "expert parallelism sizes messages on the host"})()
    on = EngineConfig(model="x", cuda_graph_mixed=True)
    assert graph_reserve(on, Blocked(), 16384, 16000, 10) == 0


def test_no_bucket_past_what_a_step_can_hold():
    from nanocore.runner.piecewise_graphs import step_token_limit
    assert step_token_limit(16384, 4, 100) == 400
    assert mixed_buckets(step_token_limit(16384, 4, 100))[-1] == 400


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("pw") / "qwen3", "qwen3", hidden_size=128, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=512, num_hidden_layers=2)


def _llm(checkpoint):
    return LLM(str(checkpoint), device="cpu", dtype="float32", max_num_seqs=6, max_num_batched_tokens=64,
               num_kv_blocks=128, block_size=16)


def _greedy(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    return llm.generate(PROMPTS, params, use_tqdm=False)


def test_segmented_steps_equal_the_plain_engine(checkpoint):
    """Every step with a prefill chunk goes through the graphs' buffers and padding (attention at each cut): same
    greedy tokens, logprobs within float32 noise; steps that are not bucket-sized are among them."""
    plain = _greedy(_llm(checkpoint))
    llm = _llm(checkpoint)
    runner = llm.engine.runner
    graphs = PiecewiseGraphs(runner.model, 64, torch.device("cpu"), torch.float32,
                             capture=False)
    sizes = []

    class Segmented:
        def can_run(self, meta, num_tokens):
            return graphs.can_run(meta, num_tokens)

        def run(self, input_ids, positions, meta):
            sizes.append(input_ids.shape[0])
            return graphs.segmented_forward(input_ids, positions, meta)

    runner.mixed_graphs = Segmented()
    seg = _greedy(llm)
    assert sizes and any(n not in graphs.buckets for n in sizes), sizes
    for a, b in zip(plain, seg):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert max(abs(la[t].logprob - lb[t].logprob) for t in la) < 1e-4


def test_which_steps_may_replay(checkpoint):
    from nanocore.layers.attention import AttentionMetadata
    runner = _llm(checkpoint).engine.runner
    graphs = PiecewiseGraphs(runner.model, 64, torch.device("cpu"), torch.float32,
                             capture=False)
    chunk = AttentionMetadata.for_prefill([40, 3])
    assert graphs.can_run(chunk, 43)
    assert not graphs.can_run(chunk, 65)  # past the largest bucket: eager
    assert not graphs.can_run(AttentionMetadata.for_prefill([1, 1]), 2)  # pure decode: DecodeGraphs' job
    chunk.kv_from_cache = True  # eval scoring keeps its own path
    assert not graphs.can_run(chunk, 43)


def test_cli_flag_reaches_the_config():
    import argparse

    from nanocore.cli.common import add_engine_args, engine_overrides
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_overrides(parser.parse_args(["--cuda-graph-mixed"]))["cuda_graph_mixed"] is True
    assert "cuda_graph_mixed" not in engine_overrides(parser.parse_args([]))  # None: on with one GPU
    assert engine_overrides(parser.parse_args(["--no-cuda-graph-mixed"]))["cuda_graph_mixed"] is False
