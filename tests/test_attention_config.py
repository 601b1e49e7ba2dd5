"""Launch configuration of the paged-attention kernels (nanocore/kernels/attention_config.py): quant paths and
their flags, decode tiles, environment overrides, the split rule. Host-side only: no kernel runs."""
from __future__ import annotations

import pytest


def test_quant_path_flags_and_defaults():
    from nanocore.kernels import paged_attention as pa
    assert pa.QUANT_PATHS == ("fold", "fp16_hwcvt") and pa.DEFAULT_QUANT_PATH == "fold"
    assert not pa._k_split("fold", (1, 1), 1)
    assert pa._k_split("fold", (2, 1), 32)
    assert not pa._k_split("fold", (2, 1), 8)  # too narrow to slice: K is dequantized before the dot
    assert not pa._k_split("fold", (0, 0), 1)
    with pytest.raises(ValueError, match="is not one of"):
        pa._k_split("fast", (1, 1), 1)
    narrow = pa.default_config(1, 2, 128, kv_itemsize=1)
    assert (narrow.block_n, narrow.num_warps, narrow.num_stages) == pa.NARROW_DECODE_TILE
    assert pa.default_config(1, 2, 128) == pa.default_config(1, 2, 128, kv_itemsize=2)
    grouped = pa.default_config(3, 2, 128, kv_itemsize=1, k_grouped=True)  # a 3-token chunk: "fold"'s own tile
    assert (grouped.block_n, grouped.num_warps, grouped.num_stages, grouped.quant_path) == (
        *pa.GROUP_K_DECODE_TILE, "fold")


def test_one_byte_decode_tile_and_its_split_rule():
    """Pure decode steps on a one-byte cache get the 1-warp fp16_hwcvt tile (the H200 sweep's best); a step with
    a chunk of 2+ tokens keeps the 4-warp tiles; 1-warp grids split from under 6 programs per SM."""
    from nanocore.kernels import attention_config as ac
    decode = ac.default_config(1, 4, 128, kv_itemsize=1)
    assert (decode.block_m, decode.block_n, decode.num_warps, decode.quant_path) == (16, 32, 1, "fp16_hwcvt")
    chunk = ac.default_config(3, 4, 128, kv_itemsize=1)
    assert (chunk.num_warps, chunk.quant_path) == (4, "fold")
    assert ac.default_config(1, 32, 128, kv_itemsize=1).num_warps == 4  # 32 GQA rows: too many for one warp
    assert ac.default_config(1, 4, 128).num_warps == 4  # a bf16 cache keeps its tile
    sms = 132
    assert ac.choose_num_splits(512, 4096, 32, sms, num_warps=1) == 4  # the sweep's best at 64 seqs x 8 heads
    assert ac.choose_num_splits(1024, 512, 32, sms, num_warps=1) == 1  # GQA 7 at 256 x 512: unsplit was fastest
    assert ac.choose_num_splits(8, 16384, 32, sms, num_warps=1) == 64  # batch 1 at 16K: fill the GPU
    assert ac.choose_num_splits(136, 1400, 32, sms, num_warps=1) == 4  # from 1 program per SM: splits of 256+ keys
    assert ac.choose_num_splits(136, 200, 32, sms, num_warps=1) == 1
    # fewer programs than SMs: splits as short as one tile, up to 64
    assert ac.choose_num_splits(8, 4096, 32, sms, num_warps=1) == 64
    assert ac.choose_num_splits(8, 1024, 32, sms, num_warps=1) == 32
    assert ac.choose_num_splits(8, 700, 32, sms, num_warps=1) == 16  # 22 tiles, rounded down to a power of two
    assert ac.choose_num_splits(8, 32, 32, sms, num_warps=1) == 1
    assert ac.choose_num_splits(128, 4096, 32, sms, num_warps=1) == 16  # 16 per SM
    assert ac.choose_num_splits(512, 4096, 64, sms) == 1  # 4-warp rule unchanged
    assert ac.choose_num_splits(256, 4096, 64, sms) == 4


def test_few_program_decode_grids_split_to_one_tile_at_short_contexts():
    """4-warp decode grids of fewer programs than SMs split at least as many ways as one-tile splits of the first
    FEW_PROGRAMS_MAX_SEQ_LEN keys (a 4-tile floor cost batch-1 TPOT); chunks (decode False) and full
    grids keep the 4-warp rule; the count never falls as the context grows. batch_choice passes decode for one-token
    rows only: a 4-token chunk in one q tile keeps the rule."""
    from nanocore.kernels import attention_config as ac
    sms = 132
    assert ac.choose_num_splits(8, 256, 64, sms, decode=True) == 4  # bf16 batch 1: 4 splits at 1 x 256
    assert ac.choose_num_splits(8, 256, 32, sms, decode=True) == 8  # the few-programs one-byte tile: 8
    assert ac.choose_num_splits(8, 256, 64, sms) == 1  # not a decode grid: 4 tiles are under the 4-warp rule's 8
    assert ac.choose_num_splits(8, 300, 64, sms, decode=True) == 4  # 5 tiles: rounded down (split_range: 2, 2, 1, 0)
    assert ac.choose_num_splits(8, 64, 64, sms, decode=True) == 1
    assert ac.choose_num_splits(128, 1024, 64, sms, decode=True) == 4  # 16 sequences x 8 heads: 4 per SM
    assert ac.choose_num_splits(8, 2048, 64, sms, decode=True) == 16  # the floor of 1,024 keys (else 8)
    assert ac.choose_num_splits(8, 16384, 64, sms, decode=True) == ac.choose_num_splits(8, 16384, 64, sms) == 64
    assert ac.choose_num_splits(132, 512, 64, sms, decode=True) == ac.choose_num_splits(132, 512, 64, sms)
    for programs in (8, 16, 64, 128):
        counts = [ac.choose_num_splits(programs, n, 64, sms, decode=True) for n in range(1, 20000, 64)]
        assert counts == sorted(counts), programs

    def splits(max_query_len):
        return ac.batch_choice(max_query_len, 1024, 1, [max_query_len], [1024], max_query_len > 1, 2, 8, 128, 2, False,
                               sms).splits
    assert splits(1) == 16 and splits(4) == 4  # the 4-token chunk: one q tile, still the 4-warp rule's 4


def test_small_one_byte_decode_batches_take_the_few_programs_tile():
    """Fewer 1-warp programs than SMs (batch 1: 8 KV heads on 132 SMs) up to FEW_PROGRAMS_MAX_SEQ_LEN take
    FEW_PROGRAMS_DECODE_TILE (split to one tile per split); longer contexts take the 1-warp tile split down to one tile
    per split; 64 sequences keep the 1-warp tile and its rule; the CPU (no SM count) keeps the 1-warp tile; 2+-token
    decode-shaped chunks keep WIDE_NARROW_TILE."""
    from nanocore.kernels import attention_config as ac

    def choice(num_seqs, seq_len=128, sms=132):
        return ac.batch_choice(1, seq_len, num_seqs, [1] * num_seqs, [seq_len] * num_seqs, False, 2, 8, 128, 1, False,
                               sms)
    small = choice(1).config
    assert (small.block_n, small.num_warps, small.num_stages) == ac.FEW_PROGRAMS_DECODE_TILE
    assert small.quant_path == "fp16_hwcvt"
    assert choice(1, ac.FEW_PROGRAMS_MAX_SEQ_LEN).splits == 32  # 32 tiles of 32 keys: one per split
    assert choice(1, 256).splits == 8 and choice(1, 200).splits == 4  # rounded down: no split left empty
    long = choice(1, ac.FEW_PROGRAMS_MAX_SEQ_LEN + 1)
    assert long.config.num_warps == 1 and long.splits == 32  # 33 tiles: splits of one tile, rounded down to 32
    assert choice(1, 16384).config.num_warps == 1 and choice(1, 16384).splits == 64
    assert choice(64, 1024).splits == 4 and choice(64, 1024).config.num_warps == 1
    chunk = ac.batch_choice(4, 128, 1, [4], [128], True, 2, 8, 128, 1, False, 132).config
    assert (chunk.block_n, chunk.num_warps, chunk.num_stages) == ac.WIDE_NARROW_TILE
    assert choice(64).config.num_warps == 1 and choice(1, sms=0).config.num_warps == 1


def test_chunks_over_a_long_cached_prefix_split_the_kv_range():
    """A chunk's few q tiles at a long context split like a decode grid (4-warp rule); big
    batches, first chunks and the CPU do not."""
    from nanocore.kernels.attention_config import batch_choice

    def splits(query_lens, seq_lens, group=7, kv_heads=4, sms=132):
        return batch_choice(max(query_lens), max(seq_lens), len(query_lens), query_lens, seq_lens, True, group,
                            kv_heads, 128, 2, False, sms).splits
    # Qwen2.5-7B, a 128-token chunk at 32K plus one decode: (15 + 1) q tiles x 4 KV heads = 64 programs
    assert splits([128, 1], [32768, 40]) == 16
    assert splits([1024, 1], [32768, 40]) == 1  # 114 q tiles x 4 heads: the grid already fills 132 SMs
    assert splits([128] + [1] * 255, [32768] + [600] * 255) == 1  # many decode programs
    assert splits([128], [128]) == 1  # a first chunk: nothing cached, never split
    assert splits([128, 1], [32768, 40], sms=0) == 1  # CPU
    assert splits([128, 1], [200, 40]) == 1  # a short prefix: under 8 tiles of keys


def test_launch_choice_is_computed_once_per_step(monkeypatch):
    """Every layer of a step shares one metadata object: the launch choice is memoised on it, not recomputed."""
    import torch

    from nanocore.kernels import paged_attention as pa
    from nanocore.layers.attention import AttentionMetadata
    calls = []
    real = pa.batch_choice
    monkeypatch.setattr(pa, "batch_choice", lambda *a, **k: calls.append(1) or real(*a, **k))
    meta = AttentionMetadata.for_prefill([5, 3])
    q, k = torch.randn(8, 4, 16), torch.randn(8, 2, 16)
    outs = [pa.paged_attention(q, k, k, None, meta, 0.25) for _ in range(3)]
    assert len(calls) == 1 and all(torch.equal(outs[0], o) for o in outs)
    pa.paged_attention(q, k, k, None, meta, 0.25, config=pa.AttentionConfig(16, 16, 4, 1))  # another choice
    assert len(calls) == 2


def test_kernel_configuration_reads_no_environment(monkeypatch):
    """The launch configuration is a function of its arguments: variables that once switched it change nothing."""
    from nanocore.kernels import attention_config as ac

    def choices():
        return [ac.batch_choice(q, n, seqs, [q] * seqs, [n] * seqs, q > 1, 2, 8, 128, itemsize, grouped, 132)
                for q in (1, 4) for n in (128, 4096) for seqs in (1, 256) for itemsize in (1, 2)
                for grouped in (False, True)]
    before = choices()
    for name, value in (("NANOCORE_ATTN_QUANT_PATH", "fold"), ("NANOCORE_ATTN_DECODE_TILE", "128/4/2"),
                        ("NANOCORE_ATTN_DECODE_MIN_SPLITS", "4"), ("NANOCORE_ATTN_DECODE_ORDER", "batch")):
        monkeypatch.setenv(name, value)
    assert choices() == before
    assert ac.decode_order_mode("cuda") == "longest_first" and ac.decode_order_mode("cpu") == "batch"
