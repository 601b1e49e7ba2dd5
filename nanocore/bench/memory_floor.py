"""The memory floor of a run: bytes that decode must read (weights every step, each sequence's KV for
every generated token) over the measured copy bandwidth. ``fraction_of_floor`` = floor time / real time."""
from __future__ import annotations

import time

import torch


def measure_copy_bandwidth(device: torch.device, num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second moved by a device-to-device copy (read + write counted), best of ``repeats``."""
    if device.type != "cuda":
        num_bytes = min(num_bytes, 1 << 27)  # CPU: 128 MiB is past the caches and quick
    src = torch.empty(num_bytes // 2, dtype=torch.float16, device=device).uniform_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def weight_bytes(model: torch.nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def decode_bytes(prompt_lens: list[int], output_lens: list[int], kv_bytes_per_token: float, weight_bytes_: int,
                 num_steps: int) -> float:
    """Weights once per step plus, for each generated token, the KV of everything before it."""
    kv_tokens_read = sum(n * p + n * (n - 1) / 2 for p, n in zip(prompt_lens, output_lens))
    return kv_tokens_read * kv_bytes_per_token + weight_bytes_ * num_steps


def floor_report(llm, prompt_lens: list[int], output_lens: list[int], num_steps: int, seconds: float) -> dict:
    runner = llm.engine.runner
    kv_per_token = runner.bytes_per_block / runner.block_size
    weights = weight_bytes(runner.model)
    bandwidth = measure_copy_bandwidth(runner.device)
    total = decode_bytes(prompt_lens, output_lens, kv_per_token, weights, num_steps)
    floor_seconds = total / bandwidth
    return {"bytes_read_at_floor": total, "weight_bytes": weights, "kv_bytes_per_token": kv_per_token,
            "copy_bandwidth_bytes_per_s": bandwidth, "floor_seconds": floor_seconds,
            "fraction_of_floor": floor_seconds / seconds if seconds else None}
