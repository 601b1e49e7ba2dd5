"""``checkpoint_support`` bodies shared by the in-tree methods, and the compressed-tensors config they write.

Each ``*_support(method, quantization_config)`` returns None when that family of methods loads the checkpoint,
else the reason (phrased for a user who named the method).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from nanocore.interfaces.quant_scheme import QuantArgs, QuantScheme
from nanocore.toolkit.checkpoint import CheckpointFormatError
from nanocore.toolkit.checkpoint_formats import (
    PACKED_FORMAT,
    UNPACKED_FORMATS,
    CheckpointFormat,
    SchemeGroup,
    parse_quantization_config,
    support_reason,
)


def _parsed(quantization_config: dict | None) -> CheckpointFormat | None | str:
    try:
        return parse_quantization_config(quantization_config)
    except CheckpointFormatError as exc:
        return str(exc)


#: The in-tree method that loads block-wise fp8 (named in the others' reasons).
FP8_BLOCK_METHOD = "fp8_w8a16"


def fp8_support(method: str, quantization_config: dict | None, blocks: bool = False) -> str | None:
    """fp8 weights per channel or per tensor (fp8 or compressed-tensors float-quantized), and with ``blocks`` also
    per tile (``block_structure`` / ``weight_block_size``, columns a multiple of 16); activations none, fp8
    dynamic per token / group or fp8 static per tensor."""
    fmt = _parsed(quantization_config)
    if isinstance(fmt, str):
        return fmt

    def judge(scheme: QuantScheme, group: SchemeGroup) -> str | None:
        w, a = scheme.weights, scheme.input_activations
        if w is None or w.type != "float" or w.num_bits != 8:
            return f"{method} loads fp8 (float 8-bit) weights, this checkpoint has {w}"
        if w.strategy == "block" and not blocks:
            return (f"{method} loads per-channel or per-tensor fp8 scales, not block-wise ones "
                    f"({list(w.block_structure or ())} tiles), which {FP8_BLOCK_METHOD!r} loads")
        if w.strategy == "block":
            reason = block_structure_reason(w.block_structure)
            if reason:
                return f"{method}: {reason}"
        elif w.strategy not in ("channel", "tensor"):
            return (f"{method} loads per-channel{', per-block' if blocks else ''} or per-tensor fp8 scales, not "
                    f"{w.strategy!r}: re-quantize with FP8_DYNAMIC{', FP8_BLOCK' if blocks else ''} or FP8")
        if a is not None and (a.type != "float" or a.num_bits != 8):
            return f"{method} quantizes activations to fp8; this checkpoint's input_activations are {a}"
        if a is not None and not a.dynamic and a.strategy != "tensor":
            return f"{method} loads static fp8 activation scales per tensor only, not {a.strategy!r}"
        return None
    return support_reason(method, fmt, ("fp8", "compressed-tensors"), ("float-quantized", "naive-quantized"), judge)


def block_structure_reason(block: tuple[int, ...] | None) -> str | None:
    """None if the block-scaled GEMM (``toolkit.gemm_block``) takes tiles of ``block = (rows, cols)``, else why."""
    if not block or len(block) != 2 or min(block) < 1:
        return f"block-wise fp8 needs a block_structure [rows, columns], this checkpoint has {block}"
    if block[1] % 16:
        return (f"block-wise fp8 with {block[1]}-column tiles is not supported (the GEMM's K tile must divide them: "
                f"a multiple of 16); re-quantize with block_structure [128, 128]")
    return None


def int8_support(method: str, quantization_config: dict | None, packed: bool = False) -> str | None:
    """compressed-tensors int-quantized: symmetric int8 weights per channel, activations none or int8; with
    ``packed`` also pack-quantized (four int8 per int32 word, as llm-compressor writes channel-wise W8A16)."""
    fmt = _parsed(quantization_config)
    if isinstance(fmt, str):
        return fmt

    def judge(scheme: QuantScheme, group: SchemeGroup) -> str | None:
        w, a = scheme.weights, scheme.input_activations
        if w is None or w.type != "int" or w.num_bits != 8 or not w.symmetric or w.strategy != "channel":
            other = " (group-wise or asymmetric packed int weights load in 'wna16')" if packed else ""
            return f"{method} loads symmetric 8-bit int channel-wise weights, this checkpoint has {w}{other}"
        if a is not None and (a.type != "int" or a.num_bits != 8):
            return f"{method} quantizes activations to int8; this checkpoint's input_activations are {a}"
        return None
    formats = tuple(f for f in UNPACKED_FORMATS if f != "float-quantized") + ((PACKED_FORMAT,) if packed else ())
    return support_reason(method, fmt, ("compressed-tensors",), formats, judge)


def weight_only_int_support(method: str, quantization_config: dict | None, bits: tuple[int, ...] = (4, 8),
                            formats: tuple[str, ...] = (PACKED_FORMAT,)) -> str | None:
    """Packed int weights (compressed-tensors pack-quantized, GPTQ), group or channel, symmetric or not."""
    fmt = _parsed(quantization_config)
    if isinstance(fmt, str):
        return fmt

    def judge(scheme: QuantScheme, group: SchemeGroup) -> str | None:
        w, a = scheme.weights, scheme.input_activations
        if w is None or w.type != "int" or w.num_bits not in bits:
            return f"{method} loads {'/'.join(map(str, bits))}-bit int weights, this checkpoint has {w}"
        if w.strategy not in ("group", "channel"):
            return f"{method} loads group-wise or channel-wise int weights, not {w.strategy!r}"
        if a is not None:
            return f"{method} is weight-only (W{w.num_bits}A16); this checkpoint also quantizes activations ({a})"
        return None
    return support_reason(method, fmt, ("compressed-tensors", "gptq"), formats, judge)


def awq_support(method: str, quantization_config: dict | None) -> str | None:
    """AutoAWQ GEMM: 4-bit int weights with zero points, group-wise (group size a multiple of 32)."""
    fmt = _parsed(quantization_config)
    if isinstance(fmt, str):
        return fmt

    def judge(scheme: QuantScheme, group: SchemeGroup) -> str | None:
        w = scheme.weights
        if w.num_bits != 4 or w.symmetric or w.strategy != "group" or w.group_size % 32:
            return (f"{method} loads 4-bit AutoAWQ checkpoints with zero points and a group size that is a multiple "
                    f"of 32, this one has {w}")
        return None
    return support_reason(method, fmt, ("awq",), ("awq-gemm",), judge)


def _args_dict(args: QuantArgs | None) -> dict[str, Any] | None:
    if args is None:
        return None
    out = asdict(args)
    out["block_structure"] = list(args.block_structure) if args.block_structure else None
    out.update(observer="minmax", actorder=None)
    return out


def fp8_checkpoint_config(activation_scheme: str) -> dict[str, Any]:
    """Per-channel fp8 weights as llm-compressor writes them (float-quantized): activations ``none`` (weight-only),
    ``dynamic`` per token (its FP8_DYNAMIC) or ``static`` per tensor (an ``input_scale`` per layer)."""
    activations = {"none": None, "dynamic": QuantArgs(8, "float", "token", dynamic=True),
                   "static": QuantArgs(8, "float", "tensor")}[activation_scheme]
    return compressed_tensors_config(QuantScheme(QuantArgs(8, "float", "channel"), activations), "float-quantized")


def compressed_tensors_config(scheme: QuantScheme, fmt: str, ignore: list[str] | None = None) -> dict[str, Any]:
    """A ``quantization_config`` as llm-compressor writes it: one group targeting every Linear."""
    group = {"targets": ["Linear"], "weights": _args_dict(scheme.weights),
             "input_activations": _args_dict(scheme.input_activations), "output_activations": None, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": list(ignore or []), "kv_cache_scheme": None}
