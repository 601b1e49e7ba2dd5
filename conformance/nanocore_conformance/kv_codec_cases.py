"""Write programs for KV codecs, shaped like the engine's: sequences over shuffled blocks, prefill chunks
then decode steps (one token per sequence, batch order shuffled, -1 padding), and scattered rewrites.

``ShadowCache`` replays a program against a codec and checks after every ``store`` that the slots it wrote
hold their new values in the layout's format and that every other slot is bit-for-bit unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from nanocore.interfaces import KVCache, KVLayout
from nanocore.layers.attention import AttentionMetadata, causal_attention_reference
from nanocore_conformance.base import generator
from nanocore_conformance.kv_codec_layout import check_stored, flat


@dataclass
class Sequence:
    blocks: list[int]
    length: int  # tokens the whole program writes
    written: int = 0

    def slots(self, block_size: int, start: int, stop: int) -> list[int]:
        return [self.blocks[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def engine_sequences(data, block_size: int, max_seqs: int = 4) -> tuple[list[Sequence], int]:
    """Sequences with lengths over 1-3 blocks on a shuffled block pool (plus unused blocks); the number of blocks."""
    lengths = [data.draw(st.integers(2, 3 * block_size)) for _ in range(data.draw(st.integers(1, max_seqs)))]
    per_seq = [-(-n // block_size) for n in lengths]
    num_blocks = sum(per_seq) + data.draw(st.integers(0, 2))
    pool = data.draw(st.permutations(range(num_blocks)))
    seqs, used = [], 0
    for n, length in zip(per_seq, lengths):
        seqs.append(Sequence(list(pool[used:used + n]), length))
        used += n
    return seqs, num_blocks


def prefill_then_decode(data, seqs: list[Sequence], block_size: int) -> list[tuple[str, list[int]]]:
    """Steps ``(name, slot_mapping)``: one or two prefill chunks of every sequence, then decode steps."""
    decode_steps = data.draw(st.integers(1, min(3, min(s.length for s in seqs) - 1)))
    steps = []
    for chunk in range(2):
        mapping = []
        for seq in data.draw(st.permutations(seqs)):
            end = seq.length - decode_steps
            stop = end if chunk else data.draw(st.integers(1, end))
            mapping += seq.slots(block_size, seq.written, stop)
            seq.written = stop
        if mapping:
            steps.append((f"prefill chunk {chunk + 1}", mapping))
    for step in range(decode_steps):
        mapping = []
        for seq in data.draw(st.permutations(seqs)):
            mapping += seq.slots(block_size, seq.written, seq.written + 1)
            seq.written += 1
        # CUDA-graph padding: the batch is filled up to a captured size with slot -1
        mapping += [-1] * data.draw(st.integers(0, 2))
        steps.append((f"decode step {step + 1} (one token per sequence)", mapping))
    return steps


def scattered_writes(data, num_slots: int) -> list[tuple[str, list[int]]]:
    """Every slot once in random order, then 1-2 rewrites of random slot subsets in random order with -1 among
    them (the last slot is never rewritten: a codec that writes slot -1 would overwrite it)."""
    steps = [("every slot, out of order", data.draw(st.permutations(range(num_slots))))]
    for i in range(data.draw(st.integers(1, 2)) if num_slots > 1 else 0):
        subset = data.draw(st.lists(st.integers(0, num_slots - 2), unique=True, min_size=1,
                                    max_size=max(1, num_slots - 1)))
        steps.append((f"rewrite {i + 1} of some slots, out of order with gaps and -1",
                      data.draw(st.permutations(subset + [-1] * data.draw(st.integers(1, 3))))))
    return steps


def kv_views(num_tokens: int, heads: int, head_dim: int, dtype, device, g: torch.Generator, spread: bool):
    """K and V as the engine passes them: strided views into one packed qkv tensor, unit normal values (times
    2**u per token, u uniform in [-2, 2], with ``spread``: scales must follow each token)."""
    magnitude = torch.exp2(torch.rand(num_tokens, 1, 1, 1, generator=g) * 4 - 2) if spread else 1.0
    packed = (torch.randn(num_tokens, 3, heads, head_dim, generator=g) * magnitude).to(dtype=dtype, device=device)
    return packed[:, 1], packed[:, 2]


def slot_bytes(cache: KVCache) -> list[torch.Tensor]:
    """Every cache tensor's bytes per slot ``[num_slots, bytes]``, copied to the CPU (bit-exact before/after
    comparisons)."""
    return [flat(t).reshape(t.shape[0] * t.shape[1], -1).view(torch.uint8).cpu().clone() for t in cache.tensors()]


class ShadowCache:
    """What each written slot must hold (the last K/V stored there), checked against the codec's cache."""

    def __init__(self, codec, cache: KVCache, layout: KVLayout, seed: int, verify: bool = True,
                 scale_rule: str | None = None):
        """``verify``: check every store (else only record it) and spread the magnitudes of the tokens (declared
        attention tolerances are for unit-scale data); ``scale_rule``: the codec's declared one."""
        self.codec, self.cache, self.layout, self.verify = codec, cache, layout, verify
        self.scale_rule = scale_rule
        self.g = generator(seed)
        num_slots = cache.num_blocks * cache.block_size
        _, _, heads, head_dim = cache.k.shape
        self.k = torch.zeros(num_slots, heads, head_dim)
        self.v = torch.zeros(num_slots, heads, head_dim)

    def store(self, name: str, mapping: list[int], dtype,
              kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """One ``store`` of ``kv`` (random K/V if None) at ``mapping``, then the checks."""
        _, _, heads, head_dim = self.cache.k.shape
        device = self.cache.k.device
        k, v = kv or kv_views(len(mapping), heads, head_dim, dtype, device, self.g, spread=self.verify)
        before = slot_bytes(self.cache) if self.verify else []
        self.codec.store(self.cache, k, v, torch.tensor(mapping, dtype=torch.int64, device=device))
        slots = torch.tensor([s for s in mapping if s >= 0], dtype=torch.long)
        rows = torch.tensor([i for i, s in enumerate(mapping) if s >= 0], dtype=torch.long)
        self.k[slots], self.v[slots] = k.cpu()[rows].float(), v.cpu()[rows].float()
        if not self.verify:
            return
        touched = torch.zeros(self.k.shape[0], dtype=torch.bool)
        touched[slots] = True
        for old, new in zip(before, slot_bytes(self.cache)):
            changed = (old != new).any(-1) & ~touched
            assert not changed.any(), (
                f"store ({name}, slot_mapping {mapping}): slot {int(changed.nonzero()[0])} was not in slot_mapping "
                f"but its bytes changed; store must write exactly the slots in slot_mapping (slot -1 is skipped)")
        # the other slots kept their bytes, hence their values: checking the new ones is enough
        check_stored(self.cache, self.layout, slots.to(device), self.k[slots], self.v[slots],
                     f"{name}, slot_mapping {mapping}", self.scale_rule)


def attention_inputs(data, seqs: list[Sequence], block_size: int, num_q_heads: int, head_dim: int, dtype, device,
                     g: torch.Generator):
    """Random q for the last 1..length tokens of every sequence and the metadata reading its written KV."""
    query_lens = [data.draw(st.integers(1, s.length)) for s in seqs]
    seq_lens = [s.length for s in seqs]
    table = torch.zeros(len(seqs), max(len(s.blocks) for s in seqs), dtype=torch.int32)
    for b, seq in enumerate(seqs):
        table[b, :len(seq.blocks)] = torch.tensor(seq.blocks, dtype=torch.int32)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.full((starts[-1],), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device), max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens, seq_lens_cpu=seq_lens, impl="torch",
    )
    q = torch.randn(starts[-1], num_q_heads, head_dim, generator=g).to(dtype=dtype, device=device)
    return q, meta


def oracle_attention(q: torch.Tensor, meta, seqs: list[Sequence], shadow: ShadowCache, block_size: int,
                     scale: float) -> torch.Tensor:
    """Float32 attention over the exact K/V the program stored (the unquantized oracle's numbers)."""
    out, start = [], 0
    for seq, lq in zip(seqs, meta.query_lens_cpu):
        slots = torch.tensor(seq.slots(block_size, 0, seq.length))
        out.append(causal_attention_reference(q[start:start + lq].float().cpu(), shadow.k[slots], shadow.v[slots],
                                              scale))
        start += lq
    return torch.cat(out)
