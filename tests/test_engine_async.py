"""Async scheduling (look-ahead decode steps) gives the synchronous engine's outputs, step for step."""
from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
# one_thread: the autouse fixture (one torch thread), imported so that it applies here
from engine_async_fixtures import drive, make_llm, mixed_params, one_thread, prompts  # noqa: E402, F401

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

ASYNC_COUNTERS = ("num_overlapped_steps", "num_discarded_lookaheads")


def stats_without_async_counters(llm: LLM) -> dict:
    stats = dataclasses.asdict(llm.stats())
    return {k: v for k, v in stats.items() if k not in ASYNC_COUNTERS}


def assert_same(waves, aborts=None, **fields):
    """Run the scenario on a synchronous and an async engine; outputs, finish steps and stats must agree."""
    sync_llm, async_llm = make_llm(False, **fields), make_llm(True, **fields)
    expected, got = drive(sync_llm, waves, aborts), drive(async_llm, waves, aborts)
    assert got == expected
    assert stats_without_async_counters(async_llm) == stats_without_async_counters(sync_llm)
    assert sync_llm.stats().num_overlapped_steps == 0
    bm = async_llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and sum(bm.ref_counts) == 0  # look-ahead blocks all came back
    return async_llm.stats()


@pytest.mark.parametrize("policy", ["prefill_first", "decode_first"])
def test_mixed_batch_equals_sync_and_overlaps(policy):
    waves = {0: list(zip(prompts(12, 0), mixed_params(0)))}
    stats = assert_same(waves, scheduler_policy=policy)
    assert stats.num_overlapped_steps > stats.num_steps // 2  # most decode steps really ran ahead
    assert stats.num_discarded_lookaheads == 0


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_prefix_cache_and_mid_flight_admissions(prefix_cache):
    shared = "the quick brown fox jumps "
    waves = {0: list(zip(prompts(6, 1, shared), mixed_params(1))),
             9: list(zip(prompts(5, 2, shared), mixed_params(2))),  # admitted while look-aheads are queued
             10: [(shared + "again", SamplingParams(temperature=0, max_tokens=12, n=2))]}
    stats = assert_same(waves, prefix_cache=prefix_cache)
    assert stats.num_cached_tokens > 0 and stats.num_overlapped_steps > 0
    assert stats.num_discarded_lookaheads >= 1  # the admissions threw a queued look-ahead away


def test_aborts_between_steps():
    waves = {0: list(zip(prompts(8, 3), [SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)] * 8))}
    stats = assert_same(waves, aborts={6: ["0", "3"], 11: ["1", "2", "4", "5", "6"], 14: ["7"]})
    assert stats.num_overlapped_steps > 0


def test_a_lookahead_dropped_by_aborting_every_row_is_counted():
    llm = make_llm(True, eos_boost=0.0)
    engine = llm.engine
    for prompt in prompts(3, 5):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    while engine.scheduler.lookahead is None:
        engine.step()
    before = llm.stats().num_discarded_lookaheads
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    assert engine.step() == [] and engine.scheduler.lookahead is None
    assert llm.stats().num_discarded_lookaheads == before + 1


def test_kv_pressure_preempts_like_sync():
    waves = {0: list(zip(prompts(8, 4), [SamplingParams(temperature=0.9, max_tokens=30, ignore_eos=True)] * 8))}
    stats = assert_same(waves, num_kv_blocks=28)
    assert stats.num_preemptions > 0 and stats.num_overlapped_steps > 0


def test_lookahead_inputs_match_a_fresh_build():
    """Positions, slots and block tables of every look-ahead step equal a from-scratch computation."""
    from nanocore.runner.inputs import block_table_array

    llm = make_llm(True, eos_boost=0.0)
    runner, bs = llm.engine.runner, llm.engine.block_manager.block_size
    prepare_ahead, checked = runner.prepare_ahead, []

    def checking(ahead, token_ids):
        inputs = prepare_ahead(ahead, token_ids)
        seqs = [next(s for s in llm.engine.scheduler.running if s.seq_id == i) for i in ahead.seq_ids]
        tables = block_table_array([s.block_table for s in seqs])
        positions = [s.num_tokens for s in seqs]
        slots = [tables[i, p // bs] * bs + p % bs for i, p in enumerate(positions)]
        assert (inputs.meta.block_tables.numpy() == tables).all()
        assert inputs.positions.tolist() == positions and inputs.meta.slot_mapping.tolist() == slots
        assert inputs.meta.seq_lens.tolist() == [p + 1 for p in positions] and inputs.input_ids.shape == (len(seqs),)
        checked.append(len(seqs))
        return inputs

    runner.prepare_ahead = checking
    llm.generate(prompts(6, 7), [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
                                 for m in (3, 9, 14, 20, 21, 25)], use_tqdm=False)
    assert len(checked) > 15 and len(set(checked)) > 3  # shrinking batches: look-aheads over row subsets


def test_admissions_under_kv_pressure_see_the_sync_free_blocks():
    """Arrivals while look-aheads hold blocks: undoing them keeps admission steps (and so outputs) exact."""
    rng = random.Random(8)
    waves = {step: [(p, SamplingParams(temperature=1.0, max_tokens=rng.randint(6, 20), ignore_eos=True))]
             for step, p in zip(range(0, 60, 3), prompts(20, 8, "xy"))}
    stats = assert_same(waves, num_kv_blocks=18)
    assert stats.num_discarded_lookaheads > 0 and stats.num_overlapped_steps > 0


@pytest.mark.cuda
def test_cuda_graph_async_equals_sync(tmp_path):
    """On the GPU: pinned uploads, the event-guarded id copy and graph replays of look-ahead steps."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from model_fixtures import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "llama", "llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, num_hidden_layers=3)
    rng = random.Random(9)
    token_prompts = [[rng.randrange(1, 500) for _ in range(rng.randint(3, 40))] for _ in range(20)]
    stop_ids = rng.sample(range(512), 12)  # sampled rows end at scattered steps: wasted look-ahead rows
    kinds = [dict(temperature=0), dict(temperature=0.9), dict(temperature=0.9, seed=3, n=2),
             dict(temperature=1.0, stop_token_ids=stop_ids)]
    params = [SamplingParams(max_tokens=rng.randint(4, 60), ignore_eos=True, **kinds[i % 4]) for i in range(20)]
    outs, stats = {}, {}
    for mode in (False, True):
        llm = LLM(str(ckpt), device="cuda", dtype="float32", max_num_seqs=32, num_kv_blocks=256,
                  async_scheduling=mode)
        assert llm.engine.runner.decode_graphs is not None
        outs[mode] = [[(c.token_ids, c.finish_reason) for c in o.outputs]
                      for o in llm.generate(token_prompts, params, use_tqdm=False)]
        stats[mode] = llm.stats()
        del llm
    assert outs[True] == outs[False]
    assert stats[True].num_overlapped_steps > stats[True].num_steps // 2
    assert any(f == "stop" for o in outs[True] for _, f in o)


def test_waiting_request_not_admitted_keeps_block_tables_exact():
    """A look-ahead's block is given back for a waiting request that then does not fit: the same sequences
    regrow with other blocks, and every prepared block table must be the real one (not a cached stale row)."""
    from nanocore.runner.inputs import block_table_array

    def greedy(n):
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    waves = {0: [([5, 6, 7, 8], greedy(40)), ([9, 10, 11, 12], greedy(14))],
             9: [([20 + i % 30 for i in range(28)], greedy(4))]}  # needs 7 of 12 blocks: waits for a finish
    runs = {}
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling, eos_boost=0.0, block_size=4, num_kv_blocks=12)
        runner, stale = llm.engine.runner, []
        prepare = runner.prepare

        def checking(plan, all_logits=False, prepare=prepare, stale=stale, llm=llm):
            inputs = prepare(plan, all_logits)
            seqs = llm.engine.scheduler.batch.seqs
            tables = block_table_array([s.block_table for s in seqs])
            got = inputs.meta.block_tables.numpy()
            stale += [s.seq_id for i, s in enumerate(seqs) if (got[i, :s.num_blocks] != tables[i, :s.num_blocks]).any()]
            return inputs

        runner.prepare = checking
        runs[async_scheduling] = drive(llm, waves)
        assert stale == []
    assert runs[True] == runs[False]
    assert llm.stats().num_discarded_lookaheads > 0
