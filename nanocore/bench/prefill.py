"""Prefill throughput: a batch of long prompts, one output token each; tokens/s and model FLOP utilisation.

FLOPs per token: 2 x (parameters outside the embedding) for the matmuls, plus causal attention
2 x 2 x layers x heads x head_dim x (average context = prompt_len / 2).
"""
from __future__ import annotations

import random
import time

import torch


def model_flops(model: torch.nn.Module, hf_config, num_seqs: int, prompt_len: int) -> float:
    embed = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n)
    matmul_params = sum(p.numel() for p in model.parameters()) - embed
    layers = hf_config.num_hidden_layers
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    tokens = num_seqs * prompt_len
    attention = 4 * layers * heads * head_dim * (prompt_len / 2) * tokens
    return 2 * matmul_params * tokens + attention


def run_prefill(llm, num_seqs: int, prompt_len: int, peak_tflops: float | None, seed: int = 0) -> dict:
    from nanocore.engine.sampling_params import SamplingParams

    engine = llm.engine
    rng = random.Random(seed)
    vocab = engine.loaded.hf_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(num_seqs)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    warmup = [rng.randrange(vocab) for _ in range(prompt_len)]  # not in the batch: no prefix-cache hit later
    llm.generate([warmup], params, use_tqdm=False)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    flops = model_flops(engine.runner.model, engine.loaded.hf_config, num_seqs, prompt_len)
    row = {"num_seqs": num_seqs, "prompt_len": prompt_len, "seconds": seconds,
           "prefill_tokens_per_s": num_seqs * prompt_len / seconds, "tflops_per_s": flops / seconds / 1e12}
    row["mfu"] = row["tflops_per_s"] / peak_tflops if peak_tflops else None
    return row
