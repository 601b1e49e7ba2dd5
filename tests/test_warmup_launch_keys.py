"""The attention launcher hides no per-batch variation from the warm-up: every compile key (constexprs, launch
options, and Triton's specialisation of the arguments it does specialise) that random serving-like batches produce
is one the warm-up's batches produce too. The kernel is replaced by a recorder (no execution); split-KV needs CUDA
(``sm_count``), so this checks the other choices; tests/test_warmup_plan.py checks the split counts."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from nanocore.builtin.unquantized_kv import UnquantizedKVCodec  # noqa: E402
from nanocore.runner.warmup import batch_inputs  # noqa: E402
from nanocore.runner.warmup_plan import AttentionShape, ServingLimits, WarmupBatch, warmup_plan  # noqa: E402
from nanocore.kernels import paged_attention as launcher  # noqa: E402

HQ, HKV, D, BLOCK = 4, 2, 32, 4
LIMITS = ServingLimits(max_num_batched_tokens=96, max_num_seqs=6, max_model_len=160)
KERNEL = launcher.paged_attention_kernel
SHAPE = AttentionShape(HQ // HKV, HKV, D, 2, False)


class KeyRecorder:
    """Stands in for a jitted kernel: ``kernel[grid](*args, **kwargs)`` records what Triton would key a compile on."""

    def __init__(self, kernel, honour_do_not_specialize: bool = True):
        self.kernel, self.keys = kernel, set()
        dns = getattr(kernel, "do_not_specialize", None) or kernel.kwargs.get("do_not_specialize") or []
        self.dns = {kernel.arg_names[x] if isinstance(x, int) else x for x in dns}
        if not honour_do_not_specialize:
            self.dns = set()

    def _arg_key(self, name, value):
        if isinstance(value, torch.Tensor):
            return name, value.dtype, value.data_ptr() % 16 == 0
        if isinstance(value, bool) or not isinstance(value, int):
            return name, type(value).__name__
        return name, None if name in self.dns else (value == 1, value % 16 == 0)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.keys.add((tuple(self._arg_key(n, a) for n, a in zip(self.kernel.arg_names, args)),
                           tuple(sorted(kwargs.items()))))
        return launch


def _keys(batches, monkeypatch, honour_do_not_specialize: bool = True, decode_order: str = "batch") -> set:
    recorder = KeyRecorder(KERNEL, honour_do_not_specialize)
    monkeypatch.setattr(launcher, "paged_attention_kernel", recorder)
    codec = UnquantizedKVCodec()
    cache = codec.allocate(64, BLOCK, HKV, D, torch.bfloat16, torch.device("cpu"))
    for batch in batches:
        _, _, meta = batch_inputs(batch, [cache], codec, BLOCK, torch.device("cpu"), decode_order)
        qkv = torch.randn(batch.num_tokens, (HQ + 2 * HKV) * D, dtype=torch.bfloat16)  # q, k, v: views, as served
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
        launcher.paged_attention(q.view(-1, HQ, D), k.view(-1, HKV, D), v.view(-1, HKV, D), cache, meta, D ** -0.5,
                                 layout=codec.layout(torch.bfloat16))
    return recorder.keys


def _random_batch(rng: random.Random) -> WarmupBatch:
    n = rng.randint(1, LIMITS.max_num_seqs)
    query = [rng.choice((1, 1, 2, 3, rng.randint(1, 40))) for _ in range(n)]
    while sum(query) > LIMITS.max_num_batched_tokens:
        query[query.index(max(query))] //= 2
    seq = [min(LIMITS.max_model_len, q + rng.choice((0, 0, rng.randint(1, 100)))) for q in query]
    return WarmupBatch(tuple(query), tuple(max(q, s) for q, s in zip(query, seq)))


@pytest.mark.parametrize("decode_order", ["batch", "longest_first"])  # the order array is a constexpr (ORDERED)
def test_random_batches_compile_nothing_the_warmup_did_not(monkeypatch, decode_order):
    warmed = _keys(warmup_plan(LIMITS, SHAPE, 0), monkeypatch, decode_order=decode_order)
    served = _keys([_random_batch(random.Random(seed)) for seed in range(150)], monkeypatch, decode_order=decode_order)
    assert served <= warmed, f"{len(served - warmed)} compile keys only serving reaches"
    assert len(warmed) >= 4  # decode, fresh first chunks, fresh with a prefix, the prefill tile


def test_without_do_not_specialize_serving_would_compile_new_keys(monkeypatch):
    """The check has teeth: were the per-batch integers specialised (== 1, divisible by 16), random batches would
    reach keys the warm-up never produced."""
    warmed = _keys(warmup_plan(LIMITS, SHAPE, 0), monkeypatch, honour_do_not_specialize=False)
    served = _keys([_random_batch(random.Random(seed)) for seed in range(150)], monkeypatch,
                   honour_do_not_specialize=False)
    assert served - warmed
