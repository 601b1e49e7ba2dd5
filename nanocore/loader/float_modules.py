"""Quantized checkpoint tensors of modules nanocore runs in float: MoE experts, routers, an untied lm_head.

llm-compressor quantizes every ``Linear`` it is not told to ignore, MoE experts included (the MoE executor takes
float ``w13`` / ``w2``). Their tensors are gathered per module while streaming the checkpoint and replaced by one
dequantized ``<module>.weight``; the linear method never sees them. compressed-tensors configs are read, and
``quant_method: fp8`` ones (vLLM / DeepSeek-V3 / Qwen3-FP8: per-channel ``weight_scale`` or block-wise
``weight_scale_inv`` tiles). A float ``weight`` (a module the producer left unquantized) passes through. Experts of
a MoE layer that holds them in fp8 (``keep_quantized``, see ``expert_weights.py``) pass through as ``weight`` +
``weight_scale``.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator

import torch

from nanocore.toolkit.checkpoint import CheckpointFormatError, is_ignored
from nanocore.toolkit.checkpoint_formats import (
    dequantize_tensors,
    group_for,
    parse_quantization_config,
    tensor_suffixes,
)

logger = logging.getLogger("nanocore")
#: Modules whose weights the engine holds in float: routed experts, routers, the shared-expert gate, lm_head.
FLOAT_MODULE = re.compile(r"^(?P<module>.*(\.experts\.\d+\.(gate|up|down)_proj|\.mlp\.gate|shared_expert_gate)"
                          r"|lm_head)\.(?P<suffix>weight\w*|input_scale|output_scale)$")


def dequantize_float_modules(weights: Iterable[tuple[str, torch.Tensor]], quantization_config: dict | None,
                             keep_quantized: Callable[[str], bool] | None = None
                             ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint stream with quantized float-module tensors replaced by their dequantized ``weight``, except
    modules for which ``keep_quantized(module)`` is true: their ``weight`` / ``weight_scale`` pass through."""
    fmt = parse_quantization_config(quantization_config) if quantization_config else None
    if fmt is None or fmt.producer not in ("compressed-tensors", "fp8"):
        yield from weights
        return
    pending: dict[str, dict[str, torch.Tensor]] = {}
    count = 0
    for name, tensor in weights:
        match = FLOAT_MODULE.match(name)
        group = None if match is None or is_ignored(match["module"], list(fmt.ignore)) else group_for(
            fmt, match["module"])
        if group is None or group.scheme.weights is None:
            yield name, tensor
            continue
        module, suffix = match["module"], match["suffix"]
        if suffix in ("input_scale", "output_scale"):
            continue  # the module runs unquantized (or weight-only fp8): its activation scales do not apply
        if keep_quantized is not None and keep_quantized(module):
            yield name, tensor
            continue
        if suffix == "weight" and tensor.dtype.is_floating_point and tensor.dtype.itemsize >= 2:
            yield name, tensor  # left unquantized by the producer (e.g. an fp8 checkpoint's router)
            continue
        if fmt.producer == "fp8" and suffix == "weight_scale_inv":
            suffix = "weight_scale"  # DeepSeek-V3's name for the block scales (they multiply, as weight_scale)
        parts = pending.setdefault(module, {})
        parts[suffix] = tensor
        if all(s in parts for s in tensor_suffixes(group)):
            yield f"{module}.weight", dequantize_tensors(pending.pop(module), group)
            count += 1
    if pending:
        module, parts = next(iter(pending.items()))
        raise CheckpointFormatError(f"the checkpoint has {sorted(parts)} for {module} but not all of "
                                    f"{list(tensor_suffixes(group_for(fmt, module)))}; it is incomplete")
    if count:
        logger.info("dequantized %d quantized expert / router / lm_head weights to float (the MoE executor and the "
                    "LM head run in the model dtype)", count)
