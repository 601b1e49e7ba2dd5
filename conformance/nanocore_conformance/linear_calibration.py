"""A checkpoint quantized with calibration (``nanocore quantize --calib-text``): ``quantize(weights, calibration)``
gets sample inputs ``[tokens, in_features]`` per linear, and what it returns must load back through the method (every
tensor into a parameter, every parameter given a tensor) and compute ``x W^T``. q/k/v (GQA, one rank) is compared on
its calibration inputs within the noise of the scheme the returned config declares (a static activation scale comes
from those inputs), after undoing any per-input scale ``quantize`` folded out of the norm before it and into the
q/k/v columns (activation-aware quantization). gate/up, o_proj and down_proj may carry folds between two quantized
linears (up -> down, v -> o), which the suite cannot undo from the checkpoint: they are checked for loading and for
a finite output of the right shape.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore_conformance.base import generator
from nanocore_conformance.linear_layers import (PREFIX, build_layers, check_quantize_output, checkpoint_weights,
                                                load_checkpoint, method_options, random_activations)
from nanocore_conformance.quant_noise import weight_step

CALIBRATION_TOKENS = 64
#: One rank (a static scale covers the whole input), GQA, q/k/v bias.
CALIBRATION_DRAW = {"tp_size": 1, "heads": (4, 2), "hidden": 31, "head_dim": 15, "intermediate": 23,
                    "qkv_bias": True}
#: The linears reading one input, per layer of the decoder layer.
INPUT_OF = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"), "o_proj": ("self_attn.o_proj",),
            "down_proj": ("mlp.down_proj",)}
QKV_NORM = PREFIX + "input_layernorm.weight"


def calibration_inputs(shape, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Sample inputs per linear prefix, as the CLI collects them: q/k/v share one, gate/up another."""
    widths = {"qkv_proj": shape.hidden, "gate_up_proj": shape.hidden, "o_proj": shape.num_heads * shape.head_dim,
              "down_proj": shape.intermediate}
    out = {}
    for layer, width in widths.items():
        x = random_activations(CALIBRATION_TOKENS, width, g=g)
        out.update({PREFIX + module: x for module in INPUT_OF[layer]})
    return out


def unfold_qkv(weights: dict, tensors: dict) -> tuple[torch.Tensor, dict]:
    """(``s``, the weights with q/k/v columns times ``s``): the per-input scale ``quantize`` folded out of the norm
    before q/k/v (``norm / s``; 1 where it left the norm alone). q/k/v then round ``W s`` and see ``x / s``."""
    s = weights[QKV_NORM].double().cpu() / tensors[QKV_NORM].double().cpu()
    qkv = {PREFIX + module + ".weight" for module in INPUT_OF["qkv_proj"]}
    return s, {n: (t.double() * s).to(t.dtype) if n in qkv else t for n, t in weights.items()}


class LinearCalibrationConformance:
    """Mixed into LinearMethodConformance."""

    def test_calibrated_checkpoint_loads_and_matches_unquantized(self, backend_cls, backend_options, dtype, device):
        shape = self.layer_shape(backend_cls, CALIBRATION_DRAW)
        g = generator(11)
        weights = {n: t.to(dtype) for n, t in checkpoint_weights(shape, g).items()}
        calibration = calibration_inputs(shape, g)
        try:
            tensors, config = backend_cls.quantize(dict(weights), dict(calibration))
        except NotImplementedError:
            pytest.skip(f"{backend_cls.__name__} does not implement quantize (plain checkpoints only)")
        except ValueError as exc:  # a method that has no use for calibration may refuse it, saying so
            pytest.skip(f"{backend_cls.__name__}.quantize refuses calibration: {exc}")
        check_quantize_output(backend_cls, weights, tensors, config)
        options = method_options(backend_options, config)
        who = f"{self.backend} (a checkpoint quantized with calibration, config {config})"
        layers = build_layers(lambda: backend_cls(dict(options)), shape, 0, 1, dtype, device)
        load_checkpoint(layers, tensors, device, who)
        s, scaled = unfold_qkv(weights, tensors)
        oracles = build_layers(UnquantizedLinearMethod, shape, 0, 1, dtype, device)
        load_checkpoint(oracles, scaled, device, "unquantized")
        scheme = backend_cls(dict(options)).quant_scheme()
        steps = {n: weight_step(t, scheme) for n, t in scaled.items() if n.endswith("proj.weight")}
        step_layers = build_layers(UnquantizedLinearMethod, dataclasses.replace(shape, qkv_bias=False), 0, 1,
                                   torch.float64, "cpu")
        load_checkpoint(step_layers, steps, "cpu", "steps")
        x = (calibration[PREFIX + "self_attn.q_proj"] / s).to(dtype=dtype, device=device)
        self._compare(layers["qkv_proj"], oracles["qkv_proj"], step_layers["qkv_proj"].weight, x, scheme,
                      f"qkv_proj of {who}")
        for name in ("gate_up_proj", "o_proj", "down_proj"):
            x = calibration[PREFIX + INPUT_OF[name][0]].to(dtype=dtype, device=device)
            out = layers[name].linear_method.apply(layers[name], x, None)
            want = oracles[name].linear_method.apply(oracles[name], x, None)
            assert out.shape == want.shape and bool(torch.isfinite(out).all()), (
                f"{name} of {who}: apply returned shape {tuple(out.shape)} (expected {tuple(want.shape)}) or "
                f"non-finite values")
