"""How many KV blocks the engine gets: a fixed count, a profiled GPU budget, or ``cpu_kv_cache_gib`` on CPU."""
from __future__ import annotations

import torch

from nanocore.config import EngineConfig
from nanocore.runner.cuda_graphs import captures_mixed_graphs
from nanocore.runner.piecewise_graphs import mixed_buckets, step_token_limit
from nanocore.interfaces import KVCodec
from nanocore.layers.attention import AttentionMetadata


def kv_bytes_per_block(codec: KVCodec, kv_cache_spec: tuple[int, int, int], dtype: torch.dtype, block_size: int) -> int:
    num_layers, num_kv_heads, head_dim = kv_cache_spec
    return num_layers * block_size * codec.bytes_per_token(num_kv_heads, head_dim, dtype)


def num_kv_blocks_for_cpu(config: EngineConfig, bytes_per_block: int) -> int:
    num_blocks = int(config.cpu_kv_cache_gib * (1 << 30)) // bytes_per_block
    if num_blocks < 1:
        raise ValueError(f"cpu_kv_cache_gib={config.cpu_kv_cache_gib} holds no KV block of {bytes_per_block} bytes; raise it")
    return num_blocks


def graph_reserve(config: EngineConfig, model, profiled_tokens: int, activation_peak: int, row_bytes: int) -> int:
    """Bytes kept for the piecewise graphs' memory pool (none when they will not be captured), which lives beside
    the eager steps' activations: the profiled activations scaled to the largest bucket plus 25% (MoE padding and
    side-stream blocks do not scale down linearly), and every bucket's output rows (``row_bytes`` each)."""
    if not captures_mixed_graphs(config, model):
        return 0
    buckets = mixed_buckets(profiled_tokens)  # the profile ran the most tokens a step can hold
    return int(1.25 * activation_peak * buckets[-1] / profiled_tokens) + sum(buckets) * row_bytes


def profile_forward(model, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """This rank's layers on a max-size batch, with the logits of each sequence's last token when it has the LM head;
    a later pipeline stage runs alone, on zero hidden states in place of its predecessor's."""
    stage = getattr(model, "stage", None)
    carried = None
    if stage is not None and not stage.is_first:
        zeros = torch.zeros(input_ids.shape[0], model.config.hidden_size, dtype=model.build.dtype,
                            device=input_ids.device)
        carried = (zeros, zeros.clone())
    out = model.forward(input_ids, positions, meta) if carried is None else model.forward(input_ids, positions, meta,
                                                                                          carried)
    if stage is not None and not stage.is_last:
        return out[0]
    model.compute_logits(out[meta.query_start_loc[1:].long() - 1])
    return out


def profile_num_kv_blocks(model, config: EngineConfig, max_model_len: int, bytes_per_block: int,
                          device: torch.device) -> int:
    """CUDA: run a max-size forward without cache, then give the KV cache what gpu_memory_utilization leaves."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    allocated_before = torch.cuda.memory_allocated(device)
    num_tokens = step_token_limit(config.max_num_batched_tokens, config.max_num_seqs, max_model_len)
    num_seqs = max(1, min(config.max_num_seqs, num_tokens // max_model_len))
    lens = [num_tokens // num_seqs] * num_seqs
    meta = AttentionMetadata.for_prefill(lens, device)
    with torch.inference_mode():
        input_ids = torch.zeros(sum(lens), dtype=torch.int64, device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        hidden = profile_forward(model, input_ids, positions, meta)
    torch.cuda.synchronize(device)
    activation_peak = torch.cuda.max_memory_allocated(device) - allocated_before
    used_now = total - free  # weights, CUDA context and other processes
    row_bytes = hidden.shape[-1] * hidden.element_size()
    budget = (total * config.gpu_memory_utilization - used_now - activation_peak
              - graph_reserve(config, model, num_tokens, activation_peak, row_bytes))
    num_blocks = int(budget // bytes_per_block)
    if num_blocks < 1:
        raise RuntimeError(
            f"no GPU memory left for the KV cache (budget {budget / 2**30:.2f} GiB after weights and a "
            f"{num_tokens}-token forward); raise gpu_memory_utilization or lower max_num_batched_tokens")
    torch.cuda.empty_cache()
    return num_blocks


def choose_num_kv_blocks(config: EngineConfig, model, max_model_len: int, bytes_per_block: int,
                         device: torch.device) -> int:
    """The configured block count, else profiled (CUDA) or sized from ``cpu_kv_cache_gib`` (CPU)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if device.type == "cuda":
        return profile_num_kv_blocks(model, config, max_model_len, bytes_per_block, device)
    return num_kv_blocks_for_cpu(config, bytes_per_block)
