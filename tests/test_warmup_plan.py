"""The kernel warm-up covers every constexpr choice a serving step can select (no compile for a
first-seen batch shape): its batches, run through the dispatch code, give exactly the choices a brute force over
all batches within the engine's limits gives; token-count choices (RMSNorm rows, GEMM and MoE configs) too."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
pytest.importorskip("triton")

from nanocore.runner.warmup_plan import (AttentionShape, ServingLimits, WarmupBatch, choice_of,  # noqa: E402
                                         warmup_plan)
from nanocore.kernels import attention_config  # noqa: E402
from nanocore.kernels.attention_config import batch_choice, default_config  # noqa: E402

BF16_QWEN3_06B = AttentionShape(group=2, num_kv_heads=8, head_dim=128, kv_itemsize=2, k_grouped=False)
CASES = [  # (limits, shape, SM count)
    (ServingLimits(256, 20, 2048), BF16_QWEN3_06B, 132),
    (ServingLimits(200, 20, 2048), AttentionShape(7, 4, 128, 2, False), 16),  # Qwen2.5-7B's group
    (ServingLimits(256, 16, 4096), AttentionShape(4, 2, 64, 1, True), 132),  # one-byte cache, grouped K
    # one-byte cache, short contexts: a few programs take the 4-warp tile unsplit, many the 1-warp tile
    (ServingLimits(256, 64, 512), AttentionShape(2, 8, 128, 1, False), 132),
    (ServingLimits(48, 4, 40), BF16_QWEN3_06B, 132),  # max_model_len below the batch budget
]


def reachable_choices(limits: ServingLimits, shape: AttentionShape, sm_count: int) -> set:
    """Every choice of a batch the scheduler may form: up to max_num_seqs rows, max_num_batched_tokens tokens,
    max_model_len per row. The choice depends on (max query m, rows n, max KV length, whether anything is read
    through the cache); KV lengths are walked at 16-token granularity (tiles are multiples of 16). A chunk's choice
    depends on its length only through the tile config and its q-tile count (its split count), so one length per
    (config, q tiles) is walked: the smallest, which admits the most rows and KV lengths."""
    out = set()
    B, S, L = limits.max_num_batched_tokens, limits.max_num_seqs, limits.max_model_len

    def add(q, s):
        out.add(batch_choice(max(q), max(s), len(q), q, s, max(q) > 1, shape.group, shape.num_kv_heads,
                             shape.head_dim, shape.kv_itemsize, shape.k_grouped, sm_count))

    walked = set()
    for m in range(1, min(B, L) + 1):
        cfg = default_config(m, shape.group, shape.head_dim, shape.kv_itemsize, k_grouped=shape.k_grouped)
        key = (cfg, m > 1, -(-m // (cfg.block_m // shape.group)))
        if key in walked:
            continue
        walked.add(key)
        lens = sorted({m, m + 1, L} | set(range(16, L + 1, 16)))
        for n in range(1, min(S, B - m + 1) + 1):
            if m >= 2 and m + 2 * (n - 1) <= B:  # first chunks only: rows of 2..m tokens, nothing cached
                add([m] + [2] * (n - 1), [m] + [2] * (n - 1))
            for s in (x for x in lens if m <= x <= L and (n > 1 or m == 1 or x > m)):
                add([m] + [1] * (n - 1), [s] + [1] * (n - 1))
    return out


@pytest.mark.parametrize("limits,shape,sms", CASES)
def test_warmup_batches_select_exactly_the_reachable_attention_choices(limits, shape, sms):
    plan = warmup_plan(limits, shape, sms)
    for b in plan:
        assert b.num_tokens <= limits.max_num_batched_tokens and len(b.query_lens) <= limits.max_num_seqs
        assert max(b.seq_lens) <= limits.max_model_len and all(s >= q for q, s in zip(b.query_lens, b.seq_lens))
    planned = {choice_of(b, shape, sms) for b in plan}
    reachable = reachable_choices(limits, shape, sms)
    assert planned == reachable, (f"not warmed: {reachable - planned}", f"unreachable: {planned - reachable}")


def test_the_h200_qwen3_plan_is_small_and_covers_every_split_count():
    plan = warmup_plan(ServingLimits(16384, 256, 40960), BF16_QWEN3_06B, 132)
    choices = {choice_of(b, BF16_QWEN3_06B, 132) for b in plan}
    assert {c.splits for c in choices} == {1, 2, 4, 8, 16, 32, 64}
    assert {c.config.block_m for c in choices} == {16, 32, 64}
    assert {(c.fresh, c.cached) for c in choices} == {(False, True), (True, True), (True, False)}
    assert len(plan) < 60


def test_a_new_choice_the_plan_does_not_walk_fails_the_check(monkeypatch):
    """A split heuristic that is not monotone in the KV length (here: 128 splits for 3 rows in a band of lengths
    past the point where the real heuristic stops growing) is a choice the plan's walk skips; the brute force
    finds it, so the equality above would fail."""
    limits, shape, sms = CASES[1]
    real = attention_config.choose_num_splits
    band = range(limits.max_model_len - 100, limits.max_model_len - 40)

    def odd(programs, max_seq_len, block_n, sm_count, num_warps=4, decode=False):
        if programs == 3 * shape.num_kv_heads and max_seq_len in band:
            return 128
        return real(programs, max_seq_len, block_n, sm_count, num_warps, decode)
    monkeypatch.setattr(attention_config, "choose_num_splits", odd)
    planned = {choice_of(b, shape, sms) for b in warmup_plan(limits, shape, sms)}
    assert {c.splits for c in reachable_choices(limits, shape, sms) - planned} == {128}


def _token_counts(limits):
    return {b.num_tokens for b in warmup_plan(limits, BF16_QWEN3_06B, 132)}


@pytest.mark.parametrize("limits", [ServingLimits(4096, 256, 40960), ServingLimits(2000, 64, 1000)])
def test_token_counts_cover_the_gemm_rmsnorm_and_moe_choices(limits):
    from nanocore.kernels.rmsnorm import tile_rows
    from nanocore.toolkit.gemm import default_config as gemm_config
    from nanocore.toolkit.gemm import int8_int8_config, weight_only_config
    counts = _token_counts(limits)
    every = range(1, limits.max_num_batched_tokens + 1)
    from nanocore.toolkit.gemm_block import block_config
    choosers = [gemm_config, weight_only_config, int8_int8_config, lambda m, n, k: block_config(m, n, k, 128, None)]
    try:
        from nanocore_awq.kernels import awq_default_config
        choosers.append(awq_default_config)
    except ImportError:
        pass
    for choose in choosers:
        assert {choose(m, 4096, 4096) for m in counts} == {choose(m, 4096, 4096) for m in every}
    for block_n in (64, 128, 1024):
        for heads in (1, 7, 16):
            assert {tile_rows(t * heads, block_n) for t in counts} == {tile_rows(t * heads, block_n) for t in every}
    moe = pytest.importorskip("nanocore_triton_fused_moe.configs")
    for experts, top_k in ((60, 4), (128, 8), (64, 6), (8, 2)):
        picked = {tuple(moe.default_config(t, experts, top_k).items()) for t in counts}
        assert picked == {tuple(moe.default_config(t, experts, top_k).items()) for t in every}


def test_warmup_batches_run_through_the_engine_on_cpu():
    """The batches are well-formed steps: the CPU engine's runner runs them (torch paths) without error."""
    from engine_fakes import fake_loaded_model

    from nanocore.engine.llm import LLM
    from nanocore.runner.warmup import run_warmup
    llm = LLM("fake", loaded_model=fake_loaded_model(), block_size=4, num_kv_blocks=64, device="cpu",
              prefix_cache="none", scheduler_policy="prefill_first", kv_codec="unquantized")
    plan = run_warmup(llm.engine.runner, ServingLimits(40, 4, 64))
    assert plan and all(isinstance(b, WarmupBatch) for b in plan)
    assert {b.num_tokens for b in plan} >= {1, 2, 4, 8, 16, 32, 40}
