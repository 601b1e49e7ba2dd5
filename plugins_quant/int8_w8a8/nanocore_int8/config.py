"""compressed-tensors ``quantization_config`` for int8 checkpoints: write one, read the activation scheme."""
from __future__ import annotations

from typing import Any

from nanocore.toolkit.checkpoint import CheckpointFormatError


def compressed_tensors_config(scheme: str) -> dict[str, Any]:
    """The config llm-compressor writes for W8A8 / W8A16 int8 (channel-wise symmetric weights)."""
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False,
               "group_size": None}
    activations = None
    if scheme != "none":
        activations = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None,
                       "strategy": "token" if scheme == "dynamic" else "tensor", "dynamic": scheme == "dynamic"}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            # the group's own format too: transformers reads it there (without it, W8A16 fails with a shape error)
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": activations,
                                          "output_activations": None, "format": "int-quantized"}},
            "ignore": []}


def activation_scheme_of(config: dict[str, Any] | None, default: str) -> str:
    """'dynamic', 'static' or 'none' from a compressed-tensors config; a non-int8 scheme is a clear error."""
    if not config:
        return default
    groups = list((config.get("config_groups") or {}).values())
    if not groups:
        raise CheckpointFormatError("compressed-tensors config has no config_groups; cannot tell how it was quantized")
    if len(groups) > 1:
        raise CheckpointFormatError("compressed-tensors configs with several config_groups are not supported "
                                    "by the int8 methods; re-quantize with one scheme for every Linear")
    weights, activations = groups[0].get("weights") or {}, groups[0].get("input_activations")
    if weights.get("type") != "int" or weights.get("num_bits") != 8 or not weights.get("symmetric", True) \
            or weights.get("strategy") != "channel":
        raise CheckpointFormatError(
            f"this compressed-tensors checkpoint has weights {weights}; the int8 methods load symmetric 8-bit int "
            f"channel-wise weights only (fp8 checkpoints: linear_method='fp8_w8a8'; int4: 'awq')")
    if not activations:
        return "none"
    if activations.get("type") != "int" or activations.get("num_bits") != 8:
        raise CheckpointFormatError(f"input_activations {activations} are not 8-bit int; choose a matching method")
    return "dynamic" if activations.get("dynamic") else "static"


def is_weight_only(config: dict[str, Any] | None) -> bool:
    """True for a valid int8 compressed-tensors config without input activations (W8A16); never raises."""
    try:
        return bool(config) and activation_scheme_of(config, "dynamic") == "none"
    except CheckpointFormatError:
        return False
