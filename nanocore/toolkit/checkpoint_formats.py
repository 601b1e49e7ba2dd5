"""What a checkpoint's ``quantization_config`` holds, in one vocabulary: per-target ``QuantScheme``s and a format.

Reads the configs the ecosystem writes: compressed-tensors (llm-compressor: ``config_groups`` / ``format`` /
``ignore``), ``fp8`` (vLLM / nanocore), ``awq`` (AutoAWQ) and ``gptq`` (AutoGPTQ / GPTQModel). Linear methods
build their ``checkpoint_support`` on it, so routing compares what the checkpoint is with what a method loads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme


class CheckpointFormatError(ValueError):
    """A checkpoint's tensors do not match the linear method that is loading them."""


#: Keys under which the ecosystem's formats list layers left unquantized (compressed-tensors, fp8, AutoAWQ).
IGNORE_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert")


def ignore_patterns(quantization_config: dict[str, Any] | None) -> list[str]:
    """The checkpoint's list of unquantized layers (loaders build those with ``unquantized``)."""
    config = quantization_config or {}
    return [p for key in IGNORE_KEYS for p in (config.get(key) or [])]

#: compressed-tensors formats whose tensors are ``weight`` (+ ``weight_scale``, ``weight_zero_point``) unpacked.
UNPACKED_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
PACKED_FORMAT = "pack-quantized"
_STRATEGIES = ("tensor", "channel", "group", "token", "block")


@dataclass(frozen=True)
class SchemeGroup:
    """One ``config_groups`` entry: the modules it targets (class names, names, ``re:`` patterns) and how."""

    targets: tuple[str, ...]
    scheme: QuantScheme
    #: compressed-tensors format of this group's tensors (float-quantized, pack-quantized, ...).
    format: str
    #: Act-order: None, "group" / "weight" (compressed-tensors) or "desc_act" (GPTQ's g_idx).
    actorder: str | None = None


@dataclass(frozen=True)
class CheckpointFormat:
    """A parsed ``quantization_config``: who wrote it, its groups, and the layers it leaves unquantized."""

    producer: str
    groups: tuple[SchemeGroup, ...]
    ignore: tuple[str, ...] = ()
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def formats(self) -> set[str]:
        return {g.format for g in self.groups}

    def uniform_group(self) -> SchemeGroup:
        """The one scheme every group shares; several different schemes is a clear error."""
        distinct = {(g.scheme, g.format, g.actorder) for g in self.groups}
        if len(distinct) != 1:
            raise CheckpointFormatError(
                f"this {self.producer} checkpoint mixes {len(distinct)} quantization schemes "
                f"({[describe(g) for g in self.groups]}); one linear method loads one scheme: re-quantize with one "
                f"scheme for every Linear (mixed precision is not supported yet)")
        return self.groups[0]

    def describe(self) -> str:
        return f"{self.producer} " + "; ".join(describe(g) for g in self.groups)


def describe(group: SchemeGroup) -> str:
    """A short human name for a group, e.g. ``pack-quantized W4A16 int group 128 asymmetric``."""
    w, a = group.scheme.weights, group.scheme.input_activations
    if w is None:
        return f"{group.format} (weights not quantized)"
    grain = f"group {w.group_size}" if w.strategy == "group" else w.strategy
    acts = "A16" if a is None else f"A{a.num_bits} {a.type} {'dynamic' if a.dynamic else 'static'} {a.strategy}"
    order = f", actorder {group.actorder}" if group.actorder else ""
    return (f"{group.format} W{w.num_bits}{acts} {w.type} {grain} "
            f"{'symmetric' if w.symmetric else 'asymmetric'}{order}")


def parse_quantization_config(config: dict[str, Any] | None) -> CheckpointFormat | None:
    """The checkpoint's format, or None for a plain checkpoint; an unreadable config is a CheckpointFormatError."""
    if not config:
        return None
    if not isinstance(config, dict):
        raise CheckpointFormatError(f"quantization_config must be a JSON object, got {type(config).__name__}")
    producer = str(config.get("quant_method", "")).lower()
    parse = _PARSERS.get(producer)
    if parse is None:
        return CheckpointFormat(producer or "unknown", (), tuple(ignore_patterns(config)), config)
    return CheckpointFormat(producer, tuple(parse(config)), tuple(ignore_patterns(config)), config)


def _compressed_tensors(config: dict) -> list[SchemeGroup]:
    groups = config.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise CheckpointFormatError("compressed-tensors quantization_config has no config_groups; cannot tell how it "
                                    "was quantized (was config.json edited by hand?)")
    top_format = config.get("format")
    out = []
    for name, group in groups.items():
        fmt = group.get("format") or top_format
        if fmt in (None, "mixed-precision"):
            raise CheckpointFormatError(f"compressed-tensors config group {name!r} has no format; every group needs "
                                        f"one (float-quantized, int-quantized, pack-quantized, naive-quantized)")
        weights, acts = group.get("weights"), group.get("input_activations")
        scheme = QuantScheme(weights=_args(weights, f"group {name!r} weights"),
                             input_activations=_args(acts, f"group {name!r} input_activations"))
        actorder = (weights or {}).get("actorder")
        out.append(SchemeGroup(tuple(group.get("targets") or ["Linear"]), scheme, fmt,
                               None if actorder in (None, False, "static") else str(actorder)))
    return out


def _args(args: dict | None, where: str) -> QuantArgs | None:
    if not args:
        return None
    strategy = args.get("strategy") or ("group" if args.get("group_size") else "tensor")
    if strategy not in _STRATEGIES:
        raise CheckpointFormatError(f"{where}: strategy {strategy!r} is not supported by nanocore (it reads "
                                    f"{list(_STRATEGIES)}); re-quantize with one of those")
    block = args.get("block_structure")
    try:
        return QuantArgs(num_bits=int(args.get("num_bits", 8)), type=args.get("type", "int"), strategy=strategy,
                         group_size=args.get("group_size") if strategy == "group" else None,
                         symmetric=bool(args.get("symmetric", True)), dynamic=bool(args.get("dynamic", False)),
                         block_structure=tuple(block) if block else None)
    except ValueError as exc:
        raise CheckpointFormatError(f"{where}: {exc}; nanocore loads int 4/8-bit and fp8 (float 8-bit)") from None


def _fp8(config: dict) -> list[SchemeGroup]:
    block = config.get("weight_block_size")
    weights = (QuantArgs(8, "float", "block", block_structure=tuple(block)) if block
               else QuantArgs(8, "float", "channel"))
    scheme_name = config.get("activation_scheme", "dynamic")
    acts = (QuantArgs(8, "float", "token", dynamic=True) if scheme_name == "dynamic"
            else QuantArgs(8, "float", "tensor"))
    return [SchemeGroup(("Linear",), QuantScheme(weights, acts), "float-quantized")]


def _awq(config: dict) -> list[SchemeGroup]:
    bits = int(config.get("bits", config.get("w_bit", 4)))
    group_size = int(config.get("group_size", config.get("q_group_size", 128)))
    weights = QuantArgs(bits, "int", "group" if group_size > 0 else "channel",
                        group_size if group_size > 0 else None, symmetric=not config.get("zero_point", True))
    version = str(config.get("version", "gemm")).lower()
    return [SchemeGroup(("Linear",), QuantScheme(weights), f"awq-{version}")]


def _gptq(config: dict) -> list[SchemeGroup]:
    bits, group_size = int(config.get("bits", 4)), int(config.get("group_size", 128))
    weights = QuantArgs(bits, "int", "group" if group_size > 0 else "channel",
                        group_size if group_size > 0 else None, symmetric=bool(config.get("sym", True)))
    fmt = str(config.get("checkpoint_format", "gptq")).lower()
    return [SchemeGroup(("Linear",), QuantScheme(weights), fmt, "desc_act" if config.get("desc_act") else None)]


_PARSERS = {"compressed-tensors": _compressed_tensors, "fp8": _fp8, "awq": _awq, "gptq": _gptq}


def group_for(fmt: CheckpointFormat, prefix: str, module_class: str = "Linear") -> SchemeGroup | None:
    """The group that quantizes module ``prefix`` (a class name target matches every module of that class)."""
    for group in fmt.groups:
        for target in group.targets:
            if target == module_class or target == prefix or prefix.endswith("." + target) or (
                    target.startswith("re:") and re.match(target[3:], prefix)):
                return group
    return None


def support_reason(method: str, fmt: CheckpointFormat | None, producers: tuple[str, ...], formats: tuple[str, ...],
                   check_scheme) -> str | None:
    """Shared body of ``checkpoint_support``: None if ``method`` loads ``fmt``, else why not.

    ``check_scheme(scheme, group) -> str | None`` judges the one scheme of a uniform checkpoint.
    """
    if fmt is None:
        return f"{method} loads quantized checkpoints only; this one is not quantized"
    if fmt.producer not in producers:
        others = f" and {' / '.join(map(repr, producers[1:]))} ones" if len(producers) > 1 else ""
        return f"{method} loads {producers[0]!r} checkpoints{others}, not quant_method {fmt.producer!r}"
    try:
        group = fmt.uniform_group()
    except CheckpointFormatError as exc:
        return str(exc)
    if group.format not in formats:
        return f"{method} loads formats {list(formats)}, not {group.format!r} ({describe(group)})"
    return check_scheme(group.scheme, group)


def tensor_suffixes(group: SchemeGroup) -> tuple[str, ...]:
    """The tensors a quantized linear of this compressed-tensors group has in the checkpoint (besides bias)."""
    w = group.scheme.weights
    names = ("weight_packed", "weight_scale", "weight_shape") if group.format == PACKED_FORMAT else ("weight",
                                                                                                     "weight_scale")
    if w is not None and not w.symmetric:
        names += ("weight_zero_point",)
    if group.actorder == "group":
        names += ("weight_g_idx",)
    return names


def dequantize_tensors(tensors: dict, group: SchemeGroup):
    """A compressed-tensors linear's float32 weight ``[N, K]`` from its checkpoint tensors (suffix -> tensor)."""
    from nanocore.toolkit.int_packing import dequantize_int, unpack_int32

    w = group.scheme.weights
    scale = tensors["weight_scale"].float()
    if group.format == PACKED_FORMAT:
        n, k = (int(v) for v in tensors["weight_shape"].tolist())
        q = unpack_int32(tensors["weight_packed"], w.num_bits, k, dim=1)
        zp = tensors.get("weight_zero_point")
        zeros = (unpack_int32(zp, w.num_bits, n, dim=0) if zp is not None
                 else torch.full(scale.shape, 1 << (w.num_bits - 1), dtype=torch.int32))
        return dequantize_int(q, scale.reshape(n, -1), zeros.reshape(n, -1), tensors.get("weight_g_idx"))
    if w is not None and w.strategy == "block":  # fp8 tiles (FP8_BLOCK): one scale per block_structure tile
        from nanocore.toolkit.gemm_block import dequantize_blocks
        return dequantize_blocks(tensors["weight"], scale, tuple(w.block_structure))
    weight = tensors["weight"].float()
    zeros = tensors.get("weight_zero_point")
    n, k = weight.shape
    scale = scale.reshape(n, -1) if scale.numel() > 1 else scale.reshape(1, 1).expand(n, 1)
    zeros = (torch.zeros_like(scale) if zeros is None else zeros.float().reshape(scale.shape))
    return dequantize_int(weight, scale, zeros, tensors.get("weight_g_idx")) if scale.shape[1] > 1 else \
        (weight - zeros) * scale
