"""Checkpoint helpers for linear methods: parameters whose loaders turn a mismatching checkpoint into a clear
error, which checkpoint tensors are quantized at all, and the offline side shared by the 8-bit methods.
"""
from __future__ import annotations

import fnmatch
import re
from typing import Any, Callable

import torch

from nanocore.interfaces import set_weight_attrs
from nanocore.toolkit.checkpoint_formats import (  # noqa: F401  (the error and the ignore list are public here too)
    IGNORE_KEYS, CheckpointFormatError, ignore_patterns, parse_quantization_config)
from nanocore.toolkit.numerics import symmetric_scale


# ---- parameters and the checks that make a wrong checkpoint a clear error -----------------------
def add_param(layer: torch.nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype,
              weight_loader: Callable, method: str, fill: float | None = None,
              full_input: int | None = None, **attrs: Any) -> torch.nn.Parameter:
    """Register ``layer.<name>`` whose loader checks the checkpoint dtype and records that it was loaded.

    ``full_input``: the checkpoint tensor's size along ``input_dim`` before any TP split (checked, since a
    row-parallel loader narrows a too-large tensor silently).
    """
    data = torch.empty(shape, dtype=dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
    param = torch.nn.Parameter(data, requires_grad=False)
    loader = checked_loader(weight_loader, layer, name, method, (attrs.get("input_dim"), full_input))
    set_weight_attrs(param, {"weight_loader": loader, **attrs})
    layer.register_parameter(name, param)
    return param


def checked_loader(weight_loader: Callable, layer: torch.nn.Module, name: str, method: str,
                   full_input: tuple[int | None, int | None] = (None, None)) -> Callable:
    dim, size = full_input

    def load(param: torch.Tensor, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        check_dtype(loaded, param.dtype, name, method)
        if dim is not None and size is not None and (loaded.dim() <= dim or loaded.shape[dim] != size):
            raise CheckpointFormatError(
                f"{method}: checkpoint tensor '{name}' has shape {tuple(loaded.shape)}, expected {size} along dim "
                f"{dim}; was the checkpoint made for another method, group size or block_structure?")
        try:
            weight_loader(param, loaded, *args, **kwargs)
        except CheckpointFormatError:
            raise
        except (ValueError, RuntimeError, AssertionError, IndexError) as exc:
            raise CheckpointFormatError(
                f"{method}: checkpoint tensor '{name}' of shape {tuple(loaded.shape)} does not fit this layer's "
                f"parameter of shape {tuple(param.shape)} ({exc}); was the checkpoint made for another method, "
                f"group size or block_structure?") from exc
        mark_loaded(layer, name)
    return load


def check_dtype(loaded: torch.Tensor, expected: torch.dtype, name: str, method: str) -> None:
    """Integer / fp8 tensors must match exactly; floating scales may come in any float dtype."""
    ok = loaded.dtype == expected or (expected.is_floating_point and expected.itemsize >= 2
                                       and loaded.dtype.is_floating_point and loaded.dtype.itemsize >= 2)
    if not ok:
        raise CheckpointFormatError(
            f"{method}: checkpoint tensor '{name}' has dtype {loaded.dtype}, expected {expected}; "
            f"this checkpoint was not made for {method!r} (check its quantization_config, or pick the "
            f"linear method that matches it)")


def mark_loaded(layer: torch.nn.Module, name: str) -> None:
    loaded = layer.__dict__.setdefault("_quant_loaded", set())
    loaded.add(name)


def check_all_loaded(layer: torch.nn.Module, names: list[str], method: str) -> None:
    """After loading: if some of the method's tensors came from the checkpoint, all of them must have."""
    loaded = layer.__dict__.get("_quant_loaded")
    if not loaded:
        return  # filled directly (tests, dummy weights), not through the checkpoint loader
    missing = [n for n in names if n not in loaded]
    if missing:
        raise CheckpointFormatError(
            f"{method}: the checkpoint has no {missing} for a layer that has {sorted(loaded)}; "
            f"it was quantized with another method (or is incomplete): pick the matching linear method")


# ---- which checkpoint tensors get quantized -------------------------------------------------------
#: Never quantized: embeddings, lm_head, norms, MoE routers (their names in HF checkpoints).
_KEEP = re.compile(r"(embed|lm_head|norm|\.mlp\.gate\.|shared_expert_gate|router|rotary)")


def quantizable_linears(weights: dict[str, torch.Tensor], ignore: list[str] = ()) -> list[str]:
    """Prefixes of the 2-D ``<prefix>.weight`` tensors to quantize; ``ignore`` takes names, globs or ``re:``."""
    out = []
    for name, tensor in weights.items():
        if not (name == "weight" or name.endswith(".weight")) or tensor.dim() != 2 or _KEEP.search(name + "."):
            continue
        prefix = name[: -len("weight")].rstrip(".")  # "" for a bare layer's tensors
        if not is_ignored(prefix, ignore):
            out.append(prefix)
    return sorted(out)


def tensor_name(prefix: str, name: str) -> str:
    """``<prefix>.<name>``, or just ``name`` for a bare layer (prefix "")."""
    return f"{prefix}.{name}" if prefix else name


def is_ignored(prefix: str, ignore: list[str]) -> bool:
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], prefix):
                return True
        elif prefix == pattern or fnmatch.fnmatch(prefix, pattern) or prefix.endswith("." + pattern):
            return True
    return False


def config_option(options: dict[str, Any], key: str, default: Any) -> Any:
    """An option given directly, else from the checkpoint's ``quantization_config`` option, else ``default``."""
    if key in options:
        return options[key]
    return (options.get("quantization_config") or {}).get(key, default)


def quantize_checkpoint_linears(method: str, weights: dict[str, torch.Tensor],
                                calibration: dict[str, torch.Tensor] | None, static_inputs: bool,
                                quantize_per_row: Callable, qmax: float,
                                with_inputs: bool = False) -> dict[str, torch.Tensor]:
    """Offline side shared by the 8-bit methods: per-row quantized ``weight`` + ``weight_scale`` for every
    quantizable linear, plus a static per-tensor ``input_scale`` from calibration when asked for.

    ``with_inputs``: call ``quantize_per_row(weight, inputs)`` with the layer's calibration inputs (or None).
    """
    out = dict(weights)
    for prefix in quantizable_linears(weights):
        w = weights[tensor_name(prefix, "weight")]
        if with_inputs:
            if calibration and prefix not in calibration:  # never a silent fallback to the uncalibrated rounding
                raise ValueError(f"{method}: calibration activations were given but none for {prefix!r} (have e.g. "
                                 f"{sorted(calibration)[:3]}); the calibration model's module names must match "
                                 f"the checkpoint's tensor names")
            q, scale = quantize_per_row(w, (calibration or {}).get(prefix))
        else:
            q, scale = quantize_per_row(w)
        out[tensor_name(prefix, "weight")], out[tensor_name(prefix, "weight_scale")] = q, scale
        if static_inputs:
            if not calibration or prefix not in calibration:
                raise ValueError(f"{method} with static activation scales needs calibration activations for "
                                 f"{prefix!r}: pass --calib-text (or use dynamic activation scales)")
            out[tensor_name(prefix, "input_scale")] = symmetric_scale(calibration[prefix], qmax, dim=None).reshape(1)
    return out


def fp8_activation_scheme(method: str, options: dict[str, Any], blocks: bool = False) -> str:
    """The fp8 checkpoint's activation scheme ("dynamic" or "static") from a method's options; block-wise fp8
    checkpoints are refused unless ``blocks`` (see ``fp8_weight_blocks``). Shared by every method that loads fp8
    checkpoints."""
    config = options.get("quantization_config") or {}
    if "activation_scheme" not in options and config.get("quant_method") == "compressed-tensors":
        return _compressed_tensors_fp8_scheme(method, config, blocks)
    scheme = config_option(options, "activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"{method}: activation_scheme must be 'dynamic' or 'static', got {scheme!r}")
    if config_option(options, "weight_block_size", None) and not blocks:
        raise CheckpointFormatError(f"{method}: block-wise fp8 checkpoints (weight_block_size) are not supported "
                                    f"by this method; fp8_w8a16 loads them (or use a per-channel fp8 checkpoint)")
    return scheme


def fp8_weight_blocks(options: dict[str, Any]) -> tuple[tuple[int, int], str] | None:
    """``((rows, cols), scale tensor name)`` of a block-wise fp8 checkpoint in a method's options (compressed-tensors
    ``block_structure`` with ``weight_scale``; ``quant_method: fp8`` ``weight_block_size`` with DeepSeek-V3's
    ``weight_scale_inv``, which despite its name multiplies too); None for per-channel / per-tensor scales."""
    config = options.get("quantization_config") or {}
    if config.get("quant_method") == "compressed-tensors":
        weights = parse_quantization_config(config).uniform_group().scheme.weights
        if weights is not None and weights.strategy == "block":
            return tuple(weights.block_structure), "weight_scale"
        return None
    block = config_option(options, "weight_block_size", None)
    return (tuple(int(v) for v in block), "weight_scale_inv") if block else None


def _compressed_tensors_fp8_scheme(method: str, config: dict[str, Any], blocks: bool = False) -> str:
    """A float-quantized compressed-tensors checkpoint's activations: static (an input_scale per layer) or not."""
    group = parse_quantization_config(config).uniform_group()
    weights, activations = group.scheme.weights, group.scheme.input_activations
    strategies = ("channel", "tensor", "block") if blocks else ("channel", "tensor")
    if weights is None or weights.type != "float" or weights.strategy not in strategies:
        raise CheckpointFormatError(f"{method}: this compressed-tensors checkpoint has weights {weights}; this method "
                                    f"loads fp8 weights with {' / '.join(strategies)} scales"
                                    + ("" if blocks or weights is None or weights.strategy != "block"
                                       else "; fp8_w8a16 loads block-wise fp8"))
    return "static" if activations is not None and not activations.dynamic else "dynamic"
