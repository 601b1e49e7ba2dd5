"""Pipeline parallelism pieces in one process: the layer split, the micro-batch cut, stage models that chain to the
whole model, the step output's typed message, and the errors a bad layout gets."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from model_fixtures import make_checkpoint  # noqa: E402
from test_moe_models import make_moe_checkpoint  # noqa: E402
from nanocore.config import EngineConfig  # noqa: E402
from nanocore.distributed import ParallelContext  # noqa: E402
from nanocore.distributed.pipeline import stage_layers  # noqa: E402
from nanocore.layers.attention import AttentionMetadata  # noqa: E402
from nanocore.loader import load_model  # noqa: E402
from nanocore.runner.kv_sizing import profile_forward  # noqa: E402
from nanocore.runner.pipeline import micro_batches  # noqa: E402
from nanocore.runner.step_plan import RowSampling, ScheduledRow, StepOutput  # noqa: E402
from nanocore.runner.wire import MalformedMessage, decode_step_output, encode_message, encode_step_output  # noqa: E402

GREEDY_ROW = RowSampling(0.0, 0, 1.0, 0.0, None, None, 0, ())


def row(seq_id: int, num_tokens: int) -> ScheduledRow:
    return ScheduledRow(seq_id, 0, list(range(num_tokens)), [0], True, 0, GREEDY_ROW)


def test_layers_split_evenly_with_the_first_stages_taking_the_rest():
    spans = [(s.start, s.end, s.is_first, s.is_last) for s in (stage_layers(7, 3, r) for r in range(3))]
    assert spans == [(0, 3, True, False), (3, 5, False, False), (5, 7, False, True)]
    assert [(s.start, s.end) for s in (stage_layers(4, 2, r) for r in range(2))] == [(0, 2), (2, 4)]
    assert 4 in stage_layers(7, 3, 1) and 5 not in stage_layers(7, 3, 1)
    with pytest.raises(ValueError, match="pipeline_parallel_size 4 needs at least 4 decoder layers but the model "
                                         "has 3"):
        stage_layers(3, 4, 0)


def test_micro_batches_cut_rows_by_tokens_in_order_and_never_empty():
    decodes = [row(i, 1) for i in range(5)]
    assert [[r.seq_id for r in mb] for mb in micro_batches(decodes, 2)] == [[0, 1, 2], [3, 4]]
    mixed = [row(0, 100), row(1, 1), row(2, 1), row(3, 1)]
    assert [[r.seq_id for r in mb] for mb in micro_batches(mixed, 2)] == [[0], [1, 2, 3]]
    assert [[r.seq_id for r in mb] for mb in micro_batches(mixed, 3)] == [[0], [1], [2, 3]]
    tail_heavy = [row(0, 1), row(1, 1), row(2, 100)]
    assert [[r.seq_id for r in mb] for mb in micro_batches(tail_heavy, 3)] == [[0], [1], [2]]
    assert [[r.seq_id for r in mb] for mb in micro_batches(decodes[:1], 4)] == [[0]]
    for rows, count in ((decodes, 4), (mixed, 4), (tail_heavy, 2)):
        cut = micro_batches(rows, count)
        assert [r for mb in cut for r in mb] == rows and all(cut) and len(cut) == min(count, len(rows))


@pytest.mark.parametrize("kind, layers, stages", [("qwen2", 3, 2), ("llama_tied", 3, 3), ("qwen3", 4, 2),
                                                  ("qwen2_moe", 3, 2)])
def test_stages_chained_give_the_whole_models_logits(tmp_path, kind, layers, stages):
    """Stage models load only their tensors (a tied LM head on the last stage from the embedding; a MoE model's
    sparse and dense layers by their checkpoint numbers) and chain exactly."""
    if kind.endswith("moe"):
        ckpt = make_moe_checkpoint(tmp_path / kind, kind)  # 3 layers, the middle one dense
    else:
        ckpt = make_checkpoint(tmp_path / kind, kind, num_hidden_layers=layers)
    config = EngineConfig(model=str(ckpt), device="cpu")
    whole = load_model(config, "cpu").model
    parts = [load_model(config, "cpu", ParallelContext(pp_rank=r, pp_size=stages)).model for r in range(stages)]
    assert sum(p.kv_cache_spec[0] for p in parts) == layers
    assert parts[0].lm_head is None and parts[-1].model.embed_tokens is None
    lens = [5, 3]
    ids = torch.randint(0, 256, (sum(lens),), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.inference_mode():
        expected = whole.compute_logits(whole(ids, positions, AttentionMetadata.for_prefill(lens)))
        carried = None
        for part in parts:
            carried = part(ids, positions, AttentionMetadata.for_prefill(lens), carried)
        got = parts[-1].compute_logits(carried)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    for part in parts:  # what sizing the KV cache runs on a GPU: each stage alone
        assert profile_forward(part, ids, positions, AttentionMetadata.for_prefill(lens)).shape == (sum(lens), 64)


def test_step_output_travels_as_typed_data():
    output = StepOutput([3, 9], [17, 2], [([17, 4], [-0.5, -1.25], 1), ([2, 2], [float("-inf"), -2.0], 3)],
                        {9: [([5, 5], [-0.1, -0.1], 1)]})
    assert decode_step_output(encode_step_output(output)) == output
    plain = StepOutput([1], [4])
    assert decode_step_output(encode_step_output(plain)) == plain
    with pytest.raises(MalformedMessage, match="a step output needs equal lists"):
        decode_step_output(encode_message("step_output", [1, 2], [4], None, None))
    with pytest.raises(MalformedMessage, match="unknown kind 'execute'"):
        decode_step_output(encode_message("execute", {}))
