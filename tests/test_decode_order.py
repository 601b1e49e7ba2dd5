"""Longest-first decode grids (the default on CUDA; the engine option ``attention_decode_order="batch"`` turns them
off): the order, its metadata from the model runner and the warm-up, and the kernel reading it (Triton interpreter
on CPU, compiled on CUDA)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from attention_cases import QUANT_LAYOUTS, check, make_case  # noqa: E402
from nanocore.kernels import attention_config as ac  # noqa: E402
from nanocore.kernels.paged_attention import AttentionConfig, paged_attention  # noqa: E402

DECODE = [(1, 150), (1, 9), (1, 64), (1, 1), (1, 150), (1, 33)]


def test_longest_first_is_a_stable_permutation():
    order = ac.longest_first([150, 9, 64, 1, 150, 33])
    assert order.tolist() == [0, 4, 2, 5, 1, 3]  # ties keep the batch order


def test_mode_is_checked():
    assert ac.decode_order_mode("cuda") == "longest_first"  # the default on CUDA
    assert ac.decode_order_mode("cpu") == "batch"  # the torch reference path ignores it
    assert ac.decode_order_mode("cpu", "longest_first") == "longest_first"  # asked for: the runner's metadata on CPU
    assert ac.decode_order_mode("cuda", "batch") == "batch"
    with pytest.raises(ValueError, match="is not one of"):
        ac.decode_order_mode("cuda", "longest")


def test_the_engine_option_is_checked_and_reaches_the_runner():
    from pydantic import ValidationError

    from nanocore.config import EngineConfig
    from nanocore.engine.llm import LLM
    assert EngineConfig().attention_decode_order == "auto"
    assert EngineConfig.load(environ={"NANOCORE_ATTENTION_DECODE_ORDER": "batch"}).attention_decode_order == "batch"
    with pytest.raises(ValidationError, match="longest_first"):
        EngineConfig(attention_decode_order="longest")
    assert LLM("dummy:tiny-qwen2", device="cpu", max_model_len=64).engine.runner.decode_order == "batch"


@pytest.mark.parametrize("layout", [None, QUANT_LAYOUTS["int8"], QUANT_LAYOUTS["k_int8_v_fp8"]])
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN rows through the merge kernel
def test_ordered_grid_computes_every_row(layout, splits, monkeypatch):
    """A decode grid launched through ``decode_order`` (longest first, heads on axis 0) against the reference and
    bit for bit against the batch-order launch: each row is still computed once, by its own program."""
    q, cache, meta = make_case(DECODE, 4, 2, 64, 16, torch.float16, layout=layout, seed=5)
    cfg = AttentionConfig(16, 16, 4, 1, num_splits=splits, quant_path="fp16_hwcvt" if layout else None)
    plain = paged_attention(q, None, None, cache, meta, 0.125, layout=layout, config=cfg)
    meta.decode_order = torch.as_tensor(ac.longest_first(meta.seq_lens_cpu), dtype=torch.int32, device=q.device)
    meta.launch_choices.clear()
    check(q, cache, meta, layout=layout, config=cfg)
    ordered = paged_attention(q, None, None, cache, meta, 0.125, layout=layout, config=cfg)
    assert torch.equal(ordered, plain)
    # the kernel reads the order: with every entry 0 only row 0 is computed, the others keep what the (NaN-filled)
    # allocation held
    real_empty = torch.empty

    def nan_empty(*args, **kwargs):
        x = real_empty(*args, **kwargs)
        return x.fill_(float("nan")) if x.is_floating_point() else x
    monkeypatch.setattr(torch, "empty", nan_empty)
    meta.decode_order = torch.zeros(len(DECODE), dtype=torch.int32, device=q.device)
    meta.launch_choices.clear()
    wrong = paged_attention(q, None, None, cache, meta, 0.125, layout=layout, config=cfg)
    monkeypatch.setattr(torch, "empty", real_empty)
    assert torch.equal(wrong[0], plain[0]) and torch.isnan(wrong[1:]).all()
    meta.decode_order = torch.arange(len(DECODE) - 1, dtype=torch.int32, device=q.device)
    meta.launch_choices.clear()  # the order is checked once per step, with the step's launch plan
    with pytest.raises(ValueError, match="a permutation of the rows"):
        paged_attention(q, None, None, cache, meta, 0.125, layout=layout, config=cfg)
    meta.decode_order = torch.arange(len(DECODE), dtype=torch.int32, device="meta")  # not q's device
    meta.launch_choices.clear()
    with pytest.raises(ValueError, match=f"on {q.device}"):
        paged_attention(q, None, None, cache, meta, 0.125, layout=layout, config=cfg)


def test_grids_of_several_q_tiles_ignore_the_order():
    """A grid with 2+ query tiles per sequence indexes (sequence, tile) pairs: the order (one entry per sequence)
    does not apply there; grids of one query tile per sequence (decode, short chunks) may take it."""
    q, cache, meta = make_case([(40, 60), (1, 70)], 4, 2, 64, 16, torch.float16)
    meta.decode_order = torch.tensor([1, 0], dtype=torch.int32, device=q.device)
    check(q, cache, meta)
    q, cache, meta = make_case([(5, 40), (1, 70)], 4, 2, 64, 16, torch.float16)
    meta.decode_order = torch.tensor([1, 0], dtype=torch.int32, device=q.device)
    check(q, cache, meta)


def test_runner_and_warmup_give_decode_steps_an_order(monkeypatch):
    from nanocore.runner.warmup import batch_inputs
    from nanocore.runner.warmup_plan import WarmupBatch
    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams

    llm = LLM("dummy:tiny-qwen2", device="cpu", max_model_len=128, attention_decode_order="longest_first")
    runner = llm.engine.runner
    seen = []
    prepare = runner.inputs._device_inputs

    def noted(*args, **kwargs):
        pos, meta, extra = prepare(*args, **kwargs)
        seen.append((meta.max_query_len, meta.seq_lens_cpu, meta.decode_order))
        return pos, meta, extra
    monkeypatch.setattr(runner.inputs, "_device_inputs", noted)
    llm.generate([[5] * 30, [6] * 3, [7] * 12], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    decodes = [(lens, order) for q_len, lens, order in seen if q_len == 1]
    assert decodes and all(order is not None for _, order in decodes)
    for lens, order in decodes:
        assert order.tolist() == np.argsort(-np.asarray(lens), kind="stable").tolist()
    assert all(order is None for q_len, _, order in seen if q_len > 1)
    cpu = torch.device("cpu")
    _, _, meta = batch_inputs(WarmupBatch((1, 1, 1), (5, 50, 7)), None, None, 16, cpu, runner.decode_order)
    assert meta.decode_order.tolist() == [1, 2, 0]
    assert batch_inputs(WarmupBatch((4, 1), (5, 50)), None, None, 16, cpu, "longest_first")[2].decode_order is None
    assert batch_inputs(WarmupBatch((1, 1), (5, 50)), None, None, 16, cpu, "batch")[2].decode_order is None


def test_decode_graphs_pass_the_order_with_padding_rows_after_it(monkeypatch):
    """The static order buffer holds the step's order, then the padding rows in order (a permutation of the bucket,
    no entry left from a larger step); a step without an order is refused. Fake graphs: no CUDA needed."""
    from nanocore.runner import cuda_graphs as cg
    from nanocore.layers.attention import AttentionMetadata

    monkeypatch.setattr(cg.DecodeGraphs, "_capture_all", lambda self, device: None)
    graphs = cg.DecodeGraphs(None, None, None, 16, 64, 16, torch.device("cpu"), "longest_first")
    seen = []

    class FakeGraph:
        def __init__(self, bs):
            self.bs = bs

        def replay(self):
            seen.append((graphs.decode_order[:self.bs].tolist(), graphs._meta(self.bs).decode_order.tolist()))
    for bs in graphs.buckets:
        graphs.graphs[bs, 64], graphs.outputs[bs, 64] = FakeGraph(bs), torch.zeros(bs, 4)

    def step(lens):
        n = len(lens)
        meta = AttentionMetadata(
            slot_mapping=torch.zeros(n, dtype=torch.int64), query_start_loc=torch.arange(n + 1, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=torch.zeros(n, 1, dtype=torch.int32),
            max_query_len=1, max_seq_len=max(lens),
            decode_order=torch.as_tensor(ac.longest_first(lens), dtype=torch.int32))
        graphs.run(torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), meta)
        return meta
    step([3, 9, 1, 9, 4, 2, 8, 7, 6, 5])
    meta = step([3, 9, 1])
    bucket = next(b for b in graphs.buckets if b >= 3)
    assert seen[-1][0] == seen[-1][1] == [1, 0, 2] + list(range(3, bucket))
    meta.decode_order = None
    with pytest.raises(RuntimeError, match="no decode_order"):
        graphs.run(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), meta)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (decode graphs)")
@pytest.mark.parametrize("kv_codec", ["unquantized", "int8"])
def test_longest_first_engine_matches_batch_order_on_cuda(kv_codec):
    """Through the decode graphs and the kernel warm-up: greedy tokens of a mixed-length batch equal the batch-order
    engine's."""
    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams

    prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((300, 5, 77, 140, 1, 33))]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outputs = {}
    for mode in ("batch", "longest_first"):
        llm = LLM("dummy:tiny-qwen2", device="cuda", max_model_len=512, kv_codec=kv_codec,
                  attention_decode_order=mode)
        outputs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm
        torch.cuda.empty_cache()
    assert outputs["longest_first"] == outputs["batch"]
