"""Decode graphs per context tier: a bucket is captured below ``max_model_len`` where attention's launch choice
(tile, KV splits) differs, and a step replays the smallest tier that holds its longest context."""
from __future__ import annotations

import pytest
import torch

from nanocore.runner import cuda_graphs as cg
from nanocore.runner.warmup_plan import AttentionShape, WarmupBatch, choice_of

QWEN3_06B = {"bf16": AttentionShape(2, 8, 128, 2, False), "one_byte": AttentionShape(2, 8, 128, 1, False)}
H200_SMS = 132


@pytest.mark.parametrize("kv", sorted(QWEN3_06B))
@pytest.mark.parametrize("max_model_len", [200, 1024, 2048, 40960])
def test_tiers_are_the_bounds_where_the_choice_changes(kv, max_model_len):
    shape = QWEN3_06B[kv]
    choice = lambda bs, s: choice_of(WarmupBatch((1,) * bs, (s,) * bs), shape, H200_SMS)  # noqa: E731
    for bs in cg.decode_buckets(256):
        tiers = cg.context_tiers(bs, max_model_len, shape, H200_SMS)
        assert tiers == sorted(set(tiers)) and tiers[-1] == max_model_len
        assert set(tiers[:-1]) <= set(cg.CONTEXT_TIERS)
        for low, high in zip(tiers, tiers[1:]):  # a captured tier chooses differently from the next one up
            assert choice(bs, low) != choice(bs, high)
        for bound in set(cg.CONTEXT_TIERS) - set(tiers):  # a skipped bound chooses as the tier that covers it
            if bound < max_model_len:
                assert choice(bs, bound) == choice(bs, next(t for t in tiers if t >= bound))


def test_batch_one_under_a_long_max_model_len_gets_its_short_tiles():
    """The case that asked for tiers: one-byte KV at batch 1 under max_model_len 40,960 kept the 1-warp tile split 64
    ways for every context; a 128-token context now replays the 256 tier (the 4-warp tile, 8 splits of one tile)."""
    shape = QWEN3_06B["one_byte"]
    assert cg.context_tiers(1, 40960, shape, H200_SMS)[:2] == [256, 1024]
    short = choice_of(WarmupBatch((1,), (256,)), shape, H200_SMS)
    assert (short.config.num_warps, short.splits) == (4, 8)
    assert cg.context_tiers(256, 40960, shape, H200_SMS) == [40960]  # enough programs: one choice at every length
    assert cg.context_tiers(1, 40960, None, H200_SMS) == [40960]


def fake_graphs(monkeypatch, max_model_len: int) -> tuple[cg.DecodeGraphs, list]:
    """DecodeGraphs of the Qwen3-0.6B one-byte shape on the CPU: replays record their (bucket, tier)."""
    monkeypatch.setattr(cg.DecodeGraphs, "_capture_all", lambda self, device: None)
    graphs = cg.DecodeGraphs(None, None, None, 16, max_model_len, 16, torch.device("cpu"), "batch",
                             shape=QWEN3_06B["one_byte"])  # a CPU device: no SMs, so the tiers are set below
    graphs.tiers = {bs: cg.context_tiers(bs, max_model_len, QWEN3_06B["one_byte"], H200_SMS) for bs in graphs.buckets}
    replayed = []

    class FakeGraph:
        def __init__(self, key):
            self.key = key

        def replay(self):
            replayed.append(self.key)
    for bs, tiers in graphs.tiers.items():
        for tier in tiers:
            graphs.graphs[bs, tier], graphs.outputs[bs, tier] = FakeGraph((bs, tier)), torch.zeros(bs, 4)
    return graphs, replayed


@pytest.mark.parametrize("lens, key", [([128], (1, 256)), ([300], (1, 1024)), ([1025], (1, 40960)),
                                       ([40960], (1, 40960)), ([5, 256, 7], (4, 256)), ([5, 300], (2, 1024))])
def test_a_step_replays_the_smallest_tier_that_holds_its_longest_context(monkeypatch, lens, key):
    from nanocore.layers.attention import AttentionMetadata
    graphs, replayed = fake_graphs(monkeypatch, 40960)
    if key[1] not in graphs.tiers[key[0]]:  # the expected tier must be one that bucket captured
        pytest.fail(f"bucket {key[0]} has tiers {graphs.tiers[key[0]]}")
    n = len(lens)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(n, dtype=torch.int64), query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=torch.zeros(n, 1, dtype=torch.int32),
        max_query_len=1, max_seq_len=max(lens))
    graphs.run(torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), meta)
    assert replayed == [key]
    assert graphs._meta(*key).max_seq_len == key[1]  # the graph was captured at the tier's length


def test_each_graph_is_captured_at_its_tier(monkeypatch):
    """Capture runs the model once eagerly and once in the graph per (bucket, tier), largest first, with the tier as
    the metadata's max_seq_len (what freezes attention's launch choice). CUDA's graph API stubbed: runs on the CPU."""
    seen = []

    class Model:
        def forward(self, input_ids, positions, meta):
            seen.append((input_ids.shape[0], meta.max_seq_len))
            return torch.zeros(input_ids.shape[0], 4)

    class Graph:
        pass

    class Capture:
        def __init__(self, graph, pool=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(cg, "context_tiers", lambda bs, max_model_len, shape, sms: [256, max_model_len] if bs < 4
                        else [max_model_len])
    graphs = cg.DecodeGraphs(Model(), None, None, 8, 2048, 16, torch.device("cpu"), "batch",
                             shape=QWEN3_06B["one_byte"])
    keys = [(8, 2048), (4, 2048), (2, 2048), (2, 256), (1, 2048), (1, 256)]
    assert seen == [k for k in keys for _ in range(2)]  # the eager warm-up, then the capture
    assert sorted(graphs.graphs) == sorted(keys) == sorted(graphs.outputs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (decode graphs)")
@pytest.mark.parametrize("kv_codec", ["unquantized", "int8"])
def test_tiered_graphs_decode_as_eager_on_cuda(kv_codec, monkeypatch):
    """Greedy tokens through the tiered decode graphs (short and long contexts under one long max_model_len) equal the
    eager engine's; the short contexts really replay a tier below max_model_len."""
    import gc

    from nanocore.engine.llm import LLM
    from nanocore.engine.sampling_params import SamplingParams

    prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((5, 90, 300, 1400))]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outputs, replayed = {}, []
    key = cg.DecodeGraphs.graph_key  # patched on the class: an engine left holding itself would keep the GPU's memory
    monkeypatch.setattr(cg.DecodeGraphs, "graph_key",
                        lambda self, n, s: replayed.append(key(self, n, s)) or key(self, n, s))
    for eager in (True, False):
        llm = LLM("dummy:tiny-qwen2", device="cuda", max_model_len=4096, kv_codec=kv_codec, enforce_eager=eager)
        graphs = llm.engine.runner.decode_graphs
        assert graphs is None or len(graphs.tiers[1]) > 1, graphs.tiers
        outputs[eager] = [[o.outputs[0].token_ids] for p in prompts
                          for o in llm.generate([p], params, use_tqdm=False)]  # one at a time: batch-1 decodes
        del llm, graphs
        gc.collect()
        torch.cuda.empty_cache()
    assert outputs[False] == outputs[True]
    assert {tier for _, tier in replayed} > {4096}, replayed
