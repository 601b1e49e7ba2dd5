"""Kernel tile configs: tuned JSON tables per (GPU, E, N, dtype, Triton version), batch-aware defaults.

A table file is named ``E={E},N={N},device_name={GPU},dtype={dtype},triton={major.minor}.json`` (N is
this rank's expert intermediate size) and maps a token count M to one config; the entry with the
nearest M is used. ``nanocore tune moe`` writes such files. Search order: the executor's
``config_dir`` option, ``$NANOCORE_MOE_CONFIG_DIR``, ``user_config_dir()`` (where the tuner writes by
default), then the files shipped in this package. A table tuned under another Triton version of the
same key is used when no exact match exists. fp8 experts (``weight_format="fp8_channel"``) have their own tables
(``...,dtype={dtype},weights=fp8_channel,...``: ``nanocore tune moe --weight-format fp8_channel``) and otherwise use
the float tables of the activations' dtype.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch

from nanocore.toolkit.paths import cache_dir

logger = logging.getLogger("nanocore.triton_fused_moe")

PACKAGE_CONFIG_DIR = Path(__file__).with_name("configs")
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def user_config_dir() -> Path:
    """``$NANOCORE_CACHE_DIR/moe_configs`` (default ``~/.cache/nanocore/moe_configs``)."""
    return cache_dir() / "moe_configs"


def triton_version() -> str:
    import triton

    return ".".join(triton.__version__.split(".")[:2])


@functools.lru_cache(maxsize=None)
def device_name(device: torch.device) -> str:
    """The GPU's name as config files spell it (cached: every MoE layer asks on every step)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return name.replace(" ", "_")


def config_file_name(num_experts: int, intermediate: int, dtype: torch.dtype, gpu: str, triton: str,
                     weight_format: str = "float") -> str:
    weights = "" if weight_format == "float" else f",weights={weight_format}"
    return (f"E={num_experts},N={intermediate},device_name={gpu},dtype={str(dtype).removeprefix('torch.')}{weights},"
            f"triton={triton}.json")


def default_config(num_tokens: int, num_experts: int, top_k: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Tiles by rows per expert: small blocks for decode, large ones once experts see many tokens."""
    rows_per_expert = num_tokens * top_k / num_experts
    if rows_per_expert <= 16:
        config = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)
    elif rows_per_expert <= 64:
        config = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    else:
        config = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    if dtype.itemsize == 4:
        config["BLOCK_K"] //= 2  # fp32 tiles take twice the shared memory per stage
    return config


def read_table(path: Path) -> dict[int, dict[str, int]]:
    """A tuned table ``{"M": {config}}``, checked so a bad file fails with its path."""
    try:
        raw = json.loads(path.read_text())
        table = {int(m): {k: int(cfg[k]) for k in CONFIG_KEYS} for m, cfg in raw.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"MoE kernel config {path} is malformed ({exc}); expected {{\"M\": {{{', '.join(CONFIG_KEYS)}}}}}; "
                         f"regenerate it with 'nanocore tune moe' or delete it") from None
    if not table:
        raise ValueError(f"MoE kernel config {path} is empty; regenerate it with 'nanocore tune moe' or delete it")
    return table


class ConfigTable:
    """Finds the tuned table for a shape once, then picks the config for each batch size."""

    def __init__(self, config_dir: str | None = None):
        dirs = [config_dir, os.environ.get("NANOCORE_MOE_CONFIG_DIR"), user_config_dir(), PACKAGE_CONFIG_DIR]
        self.search_dirs = [Path(d) for d in dirs if d]
        self._tables: dict[tuple, dict[int, dict] | None] = {}  # per instance: a method-level cache kept them all alive

    def pick(self, num_tokens: int, num_experts: int, intermediate: int, top_k: int, dtype: torch.dtype,
             device: torch.device, weight_format: str = "float") -> dict[str, int]:
        table = None
        if weight_format != "float":  # its own tuned table, else the float one of the activations' dtype
            table = self.table(num_experts, intermediate, dtype, device_name(device), weight_format)
        table = table or self.table(num_experts, intermediate, dtype, device_name(device))
        if table is None:
            return default_config(num_tokens, num_experts, top_k, dtype)
        return table[min(table, key=lambda m: (abs(m - num_tokens), m))]

    def table(self, num_experts: int, intermediate: int, dtype: torch.dtype, gpu: str,
              weight_format: str = "float") -> dict[int, dict] | None:
        key = (num_experts, intermediate, dtype, gpu, weight_format)
        if key not in self._tables:
            self._tables[key] = self._find_table(num_experts, intermediate, dtype, gpu, weight_format)
        return self._tables[key]

    def _find_table(self, num_experts: int, intermediate: int, dtype: torch.dtype, gpu: str,
                    weight_format: str = "float") -> dict[int, dict] | None:
        exact = config_file_name(num_experts, intermediate, dtype, gpu, triton_version(), weight_format)
        any_triton = config_file_name(num_experts, intermediate, dtype, gpu, "*", weight_format)
        for directory in self.search_dirs:
            if (directory / exact).is_file():
                return read_table(directory / exact)
            others = sorted(directory.glob(any_triton))
            if others:
                logger.info("MoE config %s not found; using %s (tuned under another Triton)", exact, others[-1].name)
                return read_table(others[-1])
        logger.info("no tuned MoE config %s; using batch-aware defaults", exact)
        return None
