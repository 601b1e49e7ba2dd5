"""A tiny random attention model and a character tokenizer for engine tests (no checkpoint needed)."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from nanocore.layers.attention import Attention, AttentionMetadata

VOCAB = "\x00\x01\x02 abcdefghijklmnopqrstuvwxyz.,!?ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
EOS = 2


class FakeCausalLM(nn.Module):
    """Embedding + learned positions -> N attention layers over the paged cache -> linear head."""

    def __init__(self, vocab_size=len(VOCAB), hidden=32, num_layers=2, num_heads=4, num_kv_heads=2,
                 max_positions=1024, seed=0, logit_scale=4.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        rand = lambda *shape, s=1.0: nn.Parameter(torch.randn(*shape, generator=g) * s, requires_grad=False)  # noqa: E731
        self.head_dim = hidden // num_heads
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.embed = rand(vocab_size, hidden)
        self.pos = rand(max_positions, hidden, s=0.5)
        qkv_out = (num_heads + 2 * num_kv_heads) * self.head_dim
        self.qkv = nn.ParameterList([rand(hidden, qkv_out, s=hidden ** -0.5) for _ in range(num_layers)])
        self.o = nn.ParameterList([rand(hidden, hidden, s=hidden ** -0.5) for _ in range(num_layers)])
        self.attn = nn.ModuleList([Attention(num_heads, num_kv_heads, self.head_dim, self.head_dim ** -0.5, i)
                                   for i in range(num_layers)])
        self.lm_head = rand(hidden, vocab_size, s=logit_scale * hidden ** -0.5)
        self.kv_cache_spec = (num_layers, num_kv_heads, self.head_dim)

    def forward(self, input_ids, positions, meta: AttentionMetadata):
        x = self.embed[input_ids] + self.pos[positions]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        for qkv, o, attn in zip(self.qkv, self.o, self.attn):
            h = nn.functional.layer_norm(x, x.shape[-1:])
            q, k, v = (h @ qkv).split([q_size, kv_size, kv_size], dim=-1)
            x = x + attn(q, k.contiguous(), v.contiguous(), meta) @ o
        return nn.functional.layer_norm(x, x.shape[-1:])

    def compute_logits(self, hidden):
        return (hidden @ self.lm_head).float()


class CharTokenizer:
    """One token per character of VOCAB; ids 0..2 are special (pad, bos, eos)."""

    special_ids = {0, 1, 2}
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [VOCAB.index(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(VOCAB[i] for i in ids if not (skip_special_tokens and i in self.special_ids))


def fake_loaded_model(seed=0, tokenizer=True, max_model_len=512, **model_kwargs):
    model = FakeCausalLM(seed=seed, max_positions=max_model_len, **model_kwargs).eval()
    return SimpleNamespace(model=model, hf_config=None, dtype=torch.float32, model_path=None,
                           tokenizer=CharTokenizer() if tokenizer else None, eos_token_ids=[EOS],
                           max_model_len=max_model_len, linear_method=None, moe_executor=None)


@torch.inference_mode()
def greedy_full_recompute(model, prompt_ids, max_tokens, eos=None):
    """Reference: no KV cache, recompute the whole sequence for every new token."""
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        meta = AttentionMetadata.for_prefill([len(ids)])
        hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)), meta)
        token = int(model.compute_logits(hidden[-1:]).argmax(-1))
        ids.append(token)
        if token == eos:
            break
    return ids[len(prompt_ids):]


def recorded_plans(prompts, params) -> list:
    """Every StepPlan the scheduler makes while a small fake-model engine generates ``prompts``."""
    from nanocore.engine.llm import LLM

    llm = LLM("fake", loaded_model=fake_loaded_model(), device="cpu", block_size=4, num_kv_blocks=24,
              max_num_batched_tokens=16, prefix_cache="none", kv_codec="unquantized")
    schedule, plans = llm.engine.scheduler.schedule, []

    def recording():
        plans.append(schedule())
        return plans[-1]

    llm.engine.scheduler.schedule = recording
    llm.generate(prompts, params, use_tqdm=False)
    return plans
