"""Which batches the engine's kernel warm-up runs: one per kernel variant a serving step can select.

Triton compiles a kernel once per distinct set of constexprs (per-batch integers are ``do_not_specialize``),
so a first-seen batch shape costs a compile only when it selects a new constexpr choice. The choices, all
from small enumerable sets:

- attention (``batch_choice``): the tile config by max query length (decode tiles by ``next_power_of_2(rows)``
  up to 64 rows, then the prefill tile), FRESH (a chunk of 2+ tokens), CACHED (some position read through the
  cache) and the split-KV count (a power of two up to 64) of decode-shaped grids and of chunks over a cached prefix;
- token count M: the RMSNorm row block (``next_power_of_2(rows)`` below 1024 elements), the quantized GEMMs'
  ``default_config`` and the MoE ``default_config`` change at powers of two, so every power of two up to
  ``max_num_batched_tokens`` is run once (a tuned MoE table picks by nearest M: see the doubt in the docs).

Everything here is host arithmetic over the engine's limits; ``warmup.run_warmup`` runs the batches.
"""
from __future__ import annotations

from dataclasses import dataclass

from nanocore.kernels.attention_config import AttentionChoice, batch_choice, default_config


@dataclass(frozen=True)
class ServingLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int


@dataclass(frozen=True)
class AttentionShape:
    """Per-rank attention shape and cache layout: fixed for the engine's lifetime."""

    group: int
    num_kv_heads: int
    head_dim: int
    kv_itemsize: int
    k_grouped: bool


@dataclass(frozen=True)
class WarmupBatch:
    """Sequences of ``query_lens`` new tokens each, with ``seq_lens`` (>= query) tokens after the step."""

    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def choice_of(batch: WarmupBatch, shape: AttentionShape, sm_count: int) -> AttentionChoice:
    """The attention choice of ``batch`` in a serving step (cache present, the step's K/V passed fresh)."""
    q, s = list(batch.query_lens), list(batch.seq_lens)
    return batch_choice(max(q), max(s), len(q), q, s, max(q) > 1, shape.group, shape.num_kv_heads, shape.head_dim,
                        shape.kv_itemsize, shape.k_grouped, sm_count)


def _fits(batch: WarmupBatch, limits: ServingLimits) -> bool:
    return (batch.num_tokens <= limits.max_num_batched_tokens and len(batch.query_lens) <= limits.max_num_seqs
            and max(batch.seq_lens) <= limits.max_model_len)


def _with_context(m: int, n: int, seq_len: int) -> WarmupBatch:
    """One sequence of ``m`` new tokens at ``seq_len``, plus ``n - 1`` one-token prompts."""
    return WarmupBatch((m,) + (1,) * (n - 1), (seq_len,) + (1,) * (n - 1))


def _class_reps(limits: ServingLimits, shape: AttentionShape) -> list[int]:
    """Smallest max query length of each (tile config, fresh) class: the most permissive representative."""
    reps: dict[tuple, int] = {}
    for m in range(1, min(limits.max_num_batched_tokens, limits.max_model_len) + 1):
        cfg = default_config(m, shape.group, shape.head_dim, shape.kv_itemsize, k_grouped=shape.k_grouped)
        reps.setdefault((cfg, m > 1), m)
    return sorted(reps.values())


def _candidates(m: int, limits: ServingLimits, shape: AttentionShape, sm_count: int, block_n: int):
    """Batches with max query ``m`` that span its choices: first chunks only (seq = query), and with context
    over every KV length at tile granularity and every sequence count until the choice stops changing (the split
    count grows with the KV length and shrinks with the number of programs; few programs switch tiles past
    ``FEW_PROGRAMS_MAX_SEQ_LEN``)."""
    n_max = min(limits.max_num_seqs, limits.max_num_batched_tokens - m + 1)
    for n in range(1, n_max + 1):  # first chunks only: every row m tokens, nothing cached
        if m < 2 or n * m > limits.max_num_batched_tokens:
            break
        yield WarmupBatch((m,) * n, (m,) * n)
        if choice_of(WarmupBatch((m,) * n, (m,) * n), shape, sm_count).splits == 1:
            break
    lens = sorted({m, m + 1, limits.max_model_len} | set(range(block_n, limits.max_model_len + 1, block_n)))
    lens = [s for s in lens if m <= s <= limits.max_model_len]
    for n in range(1, n_max + 1):
        usable = [s for s in lens if n > 1 or m == 1 or s > m]  # a lone chunk of 2+ needs a prefix to be CACHED
        if not usable:
            continue
        top = choice_of(_with_context(m, n, usable[-1]), shape, sm_count)
        for s in usable:
            batch = _with_context(m, n, s)
            yield batch
            if choice_of(batch, shape, sm_count) == top:  # the whole choice: the tile may change with the length too
                break
        if top.splits == 1 and n * shape.num_kv_heads >= sm_count:  # fewer programs than SMs may pick another tile
            break


def attention_batches(limits: ServingLimits, shape: AttentionShape, sm_count: int) -> list[WarmupBatch]:
    """One batch per attention choice reachable within ``limits`` (see ``reachable_choices`` in the tests)."""
    seen: dict[AttentionChoice, WarmupBatch] = {}
    for m in _class_reps(limits, shape):
        block_n = default_config(m, shape.group, shape.head_dim, shape.kv_itemsize, k_grouped=shape.k_grouped).block_n
        for batch in _candidates(m, limits, shape, sm_count, block_n):
            if _fits(batch, limits):
                seen.setdefault(choice_of(batch, shape, sm_count), batch)
    return list(seen.values())


def token_count_batches(limits: ServingLimits) -> list[WarmupBatch]:
    """Every power of two up to ``max_num_batched_tokens`` (and it), as fresh prompts of at most max_model_len."""
    counts, t = [], 1
    while t < limits.max_num_batched_tokens:
        counts.append(t)
        t *= 2
    counts.append(limits.max_num_batched_tokens)
    batches = []
    for total in counts:
        per_seq = min(limits.max_model_len, total)
        lens = (per_seq,) * (total // per_seq) + ((total % per_seq,) if total % per_seq else ())
        batches.append(WarmupBatch(lens, lens))
    return [b for b in batches if _fits(b, limits)]


def warmup_plan(limits: ServingLimits, shape: AttentionShape, sm_count: int) -> list[WarmupBatch]:
    """Token-count batches first (they cover most attention choices too), then one batch per choice left."""
    plan = token_count_batches(limits)
    covered = {choice_of(b, shape, sm_count) for b in plan}
    plan += [b for b in attention_batches(limits, shape, sm_count) if choice_of(b, shape, sm_count) not in covered]
    return plan
