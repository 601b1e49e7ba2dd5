"""``load_model``: from an EngineConfig to a model with weights, its tokenizer and limits."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nanocore.config import EngineConfig
from nanocore.distributed import ParallelContext
from nanocore.interfaces import MoEExecutor
from nanocore.loader.default_model import default_model_path
from nanocore.loader.dummy import init_dummy_weights
from nanocore.loader.presets import list_presets, preset_config
from nanocore.loader.safetensors_io import checkpoint_files, iterate_weights
from nanocore.models import CheckpointError, ModelBuildContext, build_model, check_all_loaded
from nanocore.models.registry import model_class, supported_architectures
from nanocore.loader.expert_weights import ExpertFormats
from nanocore.loader.float_modules import dequantize_float_modules
from nanocore.loader.linear_routing import quantization_config, resolve_linear_method
from nanocore.plugins import AUTO, BackendEntry, get_registry
from nanocore.toolkit.checkpoint import ignore_patterns, is_ignored

DUMMY_PREFIX = "dummy:"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: nn.Module
    hf_config: Any
    dtype: torch.dtype
    #: Checkpoint folder; None for dummy weights.
    model_path: Path | None
    tokenizer: Any | None
    eos_token_ids: list[int]
    max_model_len: int
    #: Registered name of the linear method every layer uses.
    linear_method: str
    moe_executor: MoEExecutor | None


def load_model(config: EngineConfig, device: torch.device | str, parallel: ParallelContext | None = None) -> LoadedModel:
    device, parallel = torch.device(device), parallel or ParallelContext()
    hf_config, model_path = resolve_model_source(config.model)
    dtype = resolve_dtype(config.dtype, hf_config, device)
    entry, options = resolve_linear_method(config.linear_method, config.linear_method_options, hf_config, device)
    plain_reason = entry.cls.checkpoint_support(None) if quantization_config(hf_config) is None else None
    if model_path is not None and plain_reason is not None:
        raise ValueError(  # dummy weights are drawn in any format; a real checkpoint must be in the method's
            f"linear_method {entry.name!r} loads {entry.cls.quant_method or 'quantized'!r} checkpoints but {model_path} "
            f"is not quantized (its config.json has no quantization_config); make one with 'nanocore quantize "
            f"--method {entry.name} --model {model_path} --out DIR', or use linear_method='auto' for this checkpoint")
    get_registry().instantiate(entry, options)  # surface option errors once, before building hundreds of layers
    moe_executor = resolve_moe_executor(config, hf_config, device)
    experts = ExpertFormats(quantization_config(hf_config), moe_executor, device)  # fp8 experts kept as fp8?
    build = ModelBuildContext(dtype=dtype, device=device, parallel=parallel,
                              linear_method_factory=linear_method_factory(entry, options, hf_config, device),
                              moe_executor=moe_executor, moe_shared_expert_overlap=config.moe_shared_expert_overlap,
                              moe_weight_format=experts.format_of if moe_executor is not None else None)
    model = build_model(hf_config, build)
    experts.log_choice()
    with torch.no_grad():
        if model_path is None:
            init_dummy_weights(model, config.seed)
        else:
            files = checkpoint_files(model_path)
            stream = dequantize_float_modules(iterate_weights(files), quantization_config(hf_config),
                                              keep_quantized=experts.keeps_quantized)
            check_all_loaded(model, model.load_weights(stream), str(model_path))
        for layer in model.linear_layers():
            layer.linear_method.process_weights_after_loading(layer)
    tokenizer_path = Path(config.tokenizer).expanduser() if config.tokenizer else model_path
    return LoadedModel(
        model=model.eval(), hf_config=hf_config, dtype=dtype, model_path=model_path,
        tokenizer=load_tokenizer(tokenizer_path, explicit=config.tokenizer is not None),
        eos_token_ids=eos_token_ids(hf_config, model_path),
        max_model_len=resolve_max_model_len(config.max_model_len, hf_config),
        linear_method=entry.name, moe_executor=moe_executor,
    )


def resolve_model_source(model: str) -> tuple[Any, Path | None]:
    """(HF config, checkpoint folder or None for dummy weights) of a model name."""
    from transformers import AutoConfig

    if model.startswith(DUMMY_PREFIX):
        return preset_config(model[len(DUMMY_PREFIX):]), None
    path = default_model_path() if model == "default" else Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {model!r} is not a checkpoint folder; use a folder with config.json and *.safetensors, "
            f"'default', or 'dummy:PRESET' with PRESET in {list_presets()} (nanocore never downloads)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; point model= at the folder of a Hugging Face checkpoint")
    try:
        return AutoConfig.from_pretrained(path), path
    except Exception as exc:  # not JSON, no model_type, a field of the wrong type (transformers: many types)
        reason = " ".join(str(exc).split())[:500] or type(exc).__name__  # every line: the cause is often the 2nd
        hint = (f"nanocore supports {supported_architectures()}" if "model_type" in reason or "architecture" in reason
                else "fix the file or download the checkpoint again")
        raise CheckpointError(f"cannot read {path / 'config.json'}: {reason}; {hint}") from exc


def checkpoint_dtype(hf_config) -> torch.dtype | None:
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, str):
        value = _DTYPES.get(value)
    return value if value in _DTYPES.values() else None


def resolve_dtype(name: str, hf_config, device: torch.device) -> torch.dtype:
    """Explicit dtype, else the checkpoint's on CUDA (bfloat16 if it declares none) and float32 on CPU."""
    if name != "auto":
        return _DTYPES[name]
    if device.type != "cuda":
        return torch.float32
    return checkpoint_dtype(hf_config) or torch.bfloat16


def linear_method_factory(entry: BackendEntry, options: dict, hf_config, device: torch.device):
    """prefix -> LinearMethod: ``entry``, except ``unquantized`` for layers in the checkpoint's ignore list.

    A merged layer (qkv_proj, gate_up_proj) is ignored when all of its checkpoint shards are; some but not
    all is an error, since one layer has one method.
    """
    ignore = ignore_patterns(quantization_config(hf_config))
    if not ignore:
        return lambda prefix: get_registry().instantiate(entry, options)
    shards: dict[str, list[str]] = {}
    for merged, original, _ in getattr(model_class(hf_config), "stacked_params", []):
        shards.setdefault(merged, []).append(original)
    unquantized = get_registry().resolve("linear_method", "unquantized", device)

    def factory(prefix: str):
        parent, _, leaf = prefix.rpartition(".")
        names = [f"{parent}.{o}" if parent else o for o in shards.get(leaf, [])] or [prefix]
        hits = [n for n in names if is_ignored(n, ignore)]
        if is_ignored(prefix, ignore) or (hits and len(hits) == len(names)):
            return get_registry().instantiate(unquantized)
        if hits:
            raise ValueError(f"the checkpoint's ignore list {ignore} leaves {hits} unquantized but not the rest of "
                             f"the merged layer {prefix} ({names}); one merged layer takes one linear method")
        return get_registry().instantiate(entry, options)
    return factory


def resolve_moe_executor(config: EngineConfig, hf_config, device: torch.device) -> MoEExecutor | None:
    """An executor instance for MoE architectures, None for dense ones. An executor named for a dense model is
    still looked up and given its options (then dropped): a typo must not pass because the model is dense."""
    name, options = config.backend("moe_executor")
    if not (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)):
        if name != AUTO:
            get_registry().instantiate(get_registry().get("moe_executor", name), options)
        return None
    return get_registry().build("moe_executor", name, device, options)


def resolve_max_model_len(requested: int | None, hf_config) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"config.json has max_position_embeddings {limit!r}; it must be a positive integer "
                         f"(fix config.json)")
    if requested is None:
        if limit is None:
            raise ValueError("config.json has no max_position_embeddings; set max_model_len explicitly")
        return int(limit)
    if limit is not None and requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's max_position_embeddings {limit}; "
                         f"lower max_model_len")
    return requested


def eos_token_ids(hf_config, model_path: Path | None) -> list[int]:
    """End-of-sequence ids from generation_config.json, then config.json, without duplicates."""
    sources = []
    if model_path is not None and (model_path / "generation_config.json").is_file():
        path = model_path / "generation_config.json"
        try:
            generation_config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path} is not valid JSON ({exc}); fix it, or delete it to use config.json's "
                                  f"eos_token_id") from None
        if not isinstance(generation_config, dict):
            raise CheckpointError(f"{path} must hold a JSON object, got {type(generation_config).__name__}")
        sources.append(generation_config.get("eos_token_id"))
    sources.append(getattr(hf_config, "eos_token_id", None))
    ids: list[int] = []
    for value in sources:
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    return ids


def load_tokenizer(path: Path | None, explicit: bool = False):
    """The tokenizer in ``path``, or None when there is none (dummy weights, weight-only folders)."""
    if path is None:
        return None
    if explicit and not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise FileNotFoundError(f"tokenizer folder {path} {what}; pass the folder that holds tokenizer.json "
                                f"(or tokenizer_config.json), or leave tokenizer unset to use the model's")
    has_files = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if not has_files and not explicit:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
