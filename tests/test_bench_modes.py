"""bench latency / prefill code paths on CPU, the memory-floor arithmetic and the CUDA-graph buckets."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from test_cli_engine import run_cli  # noqa: E402

from nanocore.bench.memory_floor import decode_bytes  # noqa: E402
from nanocore.runner.cuda_graphs import decode_buckets  # noqa: E402


@pytest.mark.parametrize("max_num_seqs", [1, 3, 8, 17, 256])
def test_decode_buckets_cover_every_batch_size(max_num_seqs):
    buckets = decode_buckets(max_num_seqs)
    assert buckets[-1] == max_num_seqs and buckets == sorted(set(buckets))
    for n in range(1, max_num_seqs + 1):  # no gaps: every batch has a bucket at most 8 rows larger
        bucket = next(b for b in buckets if b >= n)
        assert bucket - n < 8


def test_decode_bytes_counts_weights_per_step_and_kv_per_token():
    # one sequence, prompt 3, 2 outputs: reads KV of 3 then 4 tokens; weights twice
    assert decode_bytes([3], [2], kv_bytes_per_token=10, weight_bytes_=100, num_steps=2) == (3 + 4) * 10 + 200


@pytest.mark.parametrize("mode, extra, key", [
    ("latency", ["--prompt-len", "8", "--output-len", "4", "--repeats", "2"], "tpot_ms"),
    ("prefill", ["--num-seqs", "2", "--prompt-len", "16"], "prefill_tokens_per_s"),
])
def test_bench_mode_on_a_tiny_checkpoint(tmp_path, mode, extra, key):
    from model_fixtures import make_checkpoint
    ckpt = make_checkpoint(tmp_path / "tiny", "llama")
    out = tmp_path / "bench.json"
    result = run_cli("bench", mode, "--model", str(ckpt), "--device", "cpu", "--num-kv-blocks", "32", *extra,
                     "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert key in result.stdout
    data = json.loads(out.read_text())
    assert data["result"][key] > 0 and data["kv_capacity_tokens"] == 32 * 16
    assert {"torch", "git_commit", "device"} <= set(data["environment"])


def test_latency_rejects_a_single_output_token(tmp_path):
    from model_fixtures import make_checkpoint
    ckpt = make_checkpoint(tmp_path / "tiny", "llama")
    result = run_cli("bench", "latency", "--model", str(ckpt), "--device", "cpu", "--output-len", "1")
    assert result.returncode != 0 and "--output-len >= 2" in result.stderr


def test_an_eager_moe_executor_blocks_cuda_graphs():
    """The eager MoE executor syncs with the host, so decode must not be captured with it."""
    import torch

    from nanocore.builtin.eager_moe import EagerMoEExecutor
    from nanocore.runner.cuda_graphs import graph_blocker

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert graph_blocker(model) is None
    model[0].executor = EagerMoEExecutor()
    assert "eager" in graph_blocker(model).lower() or "EagerMoEExecutor" in graph_blocker(model)


def test_expert_parallel_dispatch_blocks_cuda_graphs():
    """EP's all-to-all sizes its messages on the host: the model says so (no config flag is flipped)."""
    import torch

    from nanocore.runner.cuda_graphs import graph_blocker
    from nanocore.layers.moe import AllToAllPrepareFinalize, LocalPrepareFinalize

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model[0].prepare_finalize = LocalPrepareFinalize()
    assert graph_blocker(model) is None
    model[0].prepare_finalize = AllToAllPrepareFinalize(group=None, ep_size=2, num_local_experts=4)
    assert "expert parallelism" in graph_blocker(model)
