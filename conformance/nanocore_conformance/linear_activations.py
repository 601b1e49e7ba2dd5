"""Activations are rounded as ``quant_scheme()`` declares: a declared scheme says what ``apply`` computes, not only
how far it may be off (the tolerance of every other linear check is only a bound, which computing from unrounded
activations also meets).

One prefill-sized batch (64 rows: a method may read decode-sized ones through a more accurate path) probes the
rounding itself. The checkpoint's weights are zero in input column 0; each even row puts a loud value there and
quiet values, a quarter of half a rounding step of the loud value's scale, in the other inputs of its scale block;
odd rows hold the quiet values alone (a method whose own checkpoint declares no activation rounding is skipped,
and not asked for a calibrated one). Rounded as declared, a quiet value is zero, so every output of an even row is
zero, and of every row when the scale is one per tensor (dynamic: the batch's loud values set it; static: the
``quantize`` checkpoint is calibrated on the batch). From unrounded activations the quiet values show.
A method that computes more accurately than it declares opts out with
``conformance_requirements = {"rounds_declared_activations": False}``: its scheme then only bounds the error.
"""
from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore.interfaces.quant_scheme import QuantArgs
from nanocore_conformance.base import generator
from nanocore_conformance.compat import targeted_minor, warn_legacy
from nanocore_conformance.linear_boundaries import bad_rows
from nanocore_conformance.linear_layers import (PREFIX, build_layers, check_quantize_output, checkpoint_weights,
                                                load_checkpoint, method_options, quantize_layer)
from nanocore_conformance.quant_noise import FP8_MANTISSA_BITS, FP8_MAX, FP8_MIN_NORMAL_EXP

PROBE_ROWS = 64
LOUD = 2.0 ** 12
#: The quiet values' share of the largest value the declared rounding makes zero (room for a scale search).
MARGIN = 0.25
#: The plugin API minor that added the rule: backends written for an older one are warned, not failed.
RULE_SINCE = (1, 6)
PROBE_DRAW = {"tp_size": 1, "heads": (2, 2), "hidden": 3, "head_dim": 5, "intermediate": 7, "qkv_bias": False}
INPUTS = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"), "o_proj": ("self_attn.o_proj",),
          "down_proj": ("mlp.down_proj",)}


def half_step(args: QuantArgs) -> float:
    """Half the smallest rounding step, as a share of the largest |value| one scale covers: smaller values are 0."""
    if args.type == "float":  # e4m3: the smallest subnormal is 2^-9 of the scale, which is amax / 448
        return 2.0 ** (FP8_MIN_NORMAL_EXP - FP8_MANTISSA_BITS - 1) / FP8_MAX
    levels = 2 ** (args.num_bits - 1) - 1 if args.symmetric else 2 ** args.num_bits - 1
    return 0.5 / levels


def probe_input(k: int, args: QuantArgs) -> torch.Tensor:
    """``[PROBE_ROWS, k]``: even rows loud in column 0, every row quiet (alternating signs) in the rest of the block."""
    block = args.group_size if args.strategy == "group" and args.group_size else k
    x = torch.zeros(PROBE_ROWS, k)
    quiet = LOUD * MARGIN * half_step(args)
    signs = torch.tensor([1.0, -1.0]).repeat(block)[1:block]
    x[:, 1:block] = quiet * signs
    x[0::2, 0] = LOUD
    return x


class LinearActivationConformance:
    """Mixed into LinearMethodConformance."""

    #: Whether ``apply`` rounds activations as ``quant_scheme()`` declares (False: the scheme only bounds the error).
    rounds_declared_activations: ClassVar[bool] = True

    def test_activations_rounded_as_declared(self, backend_cls, backend_entry, backend_options, dtype, device):
        self._check_activation_rounding(backend_cls, backend_entry, backend_options, dtype, device)

    @pytest.mark.cuda
    def test_activations_rounded_as_declared_on_cuda(self, backend_cls, backend_entry, backend_options, cuda_dtype,
                                                     cuda_device):
        self._check_activation_rounding(backend_cls, backend_entry, backend_options, cuda_dtype, cuda_device)

    def _check_activation_rounding(self, backend_cls, backend_entry, options, dtype, device):
        if not self.rounds_declared_activations:
            pytest.skip(f"{backend_cls.__name__} declares rounds_declared_activations False: its quant_scheme() "
                        f"only bounds the error")
        shape = self.layer_shape(backend_cls, PROBE_DRAW)
        weights = checkpoint_weights(shape, generator(13))
        for name, w in weights.items():
            if name.endswith("proj.weight"):
                w[:, 0] = 0  # the loud input meets zero weights: only the quiet inputs can move the output
        weights = {n: t.to(dtype) for n, t in weights.items()}
        made = self._probe_checkpoint(backend_cls, options, shape, weights, calibrated=False)
        if made is None:  # weight-only (its quantize is not asked for a calibrated checkpoint either)
            pytest.skip(f"{backend_cls.__name__}'s quant_scheme() rounds no activations (or only by a strategy "
                        f"the probe does not know)")
        if targeted_minor(backend_cls, backend_entry) < RULE_SINCE:
            warn_legacy(backend_cls, "written for a plugin API before 1.6, whose declared activation rounding only "
                        "bounded the error; declare api_version = \"1.6\" once apply rounds activations as "
                        "quant_scheme() says (or declare conformance_requirements "
                        "{'rounds_declared_activations': False})")
            pytest.skip(f"{backend_cls.__name__} targets a plugin API before 1.6 (activation rounding not probed)")
        self._probe_layers(backend_cls, *made, shape, weights, dtype, device)
        made = self._probe_checkpoint(backend_cls, options, shape, weights, calibrated=True)
        if made is not None:
            self._probe_layers(backend_cls, *made, shape, weights, dtype, device)

    @staticmethod
    def _probe_checkpoint(backend_cls, options, shape, weights, calibrated):
        """(tensors, options, activation args) of the checkpoint ``quantize`` writes (calibrated on the probe
        batch), or None where it writes none or its method declares no activation rounding the probe knows."""
        if not calibrated:
            tensors, config = quantize_layer(backend_cls, weights)
        else:
            widths = {"qkv_proj": shape.hidden, "gate_up_proj": shape.hidden,
                      "o_proj": shape.num_heads * shape.head_dim, "down_proj": shape.intermediate}
            calibration = {PREFIX + module: probe_input(widths[layer], QuantArgs(8, "int", "token"))
                           for layer, modules in INPUTS.items() for module in modules}
            try:
                tensors, config = backend_cls.quantize(dict(weights), calibration)
            except (NotImplementedError, ValueError):  # the calibration check reports a refusal that is wrong
                return None
            check_quantize_output(backend_cls, weights, tensors, config)
        options = method_options(options, config)
        scheme = backend_cls(dict(options)).quant_scheme()
        args = scheme.input_activations if scheme is not None else None
        if args is None or args.strategy not in ("token", "tensor", "group"):
            return None
        if calibrated and args.strategy != "tensor":
            return None  # dynamic scales: the uncalibrated checkpoint probes them
        return tensors, options, args

    def _probe_layers(self, backend_cls, tensors, options, args, shape, weights, dtype, device):
        layers = build_layers(lambda: backend_cls(dict(options)), shape, 0, 1, dtype, device)
        load_checkpoint(layers, tensors, device, self.backend)
        oracles = build_layers(UnquantizedLinearMethod, shape, 0, 1, torch.float32, "cpu")
        load_checkpoint(oracles, {n: t.float() for n, t in weights.items()}, "cpu", "unquantized")
        for name, layer in layers.items():
            x = probe_input(layer.input_size_per_partition, args)
            got = layer.linear_method.apply(layer, x.to(dtype=dtype, device=device), None).float().cpu()
            unrounded = oracles[name].linear_method.apply(oracles[name], x, None)
            checked = torch.ones(PROBE_ROWS, dtype=torch.bool)
            if args.strategy != "tensor":
                checked[1::2] = False  # a quiet row's own scale keeps its quiet values
            limit = 0.01 * unrounded.abs().amax(dim=1, keepdim=True)
            bad = ~(got.abs() <= limit) & checked[:, None]  # NaN counts as bad
            if bad.any():
                row = int(bad.any(dim=1).nonzero()[0])
                raise AssertionError(
                    f"{name}: quant_scheme() declares activations rounded as {args}, so inputs below half a "
                    f"rounding step of their scale ({half_step(args):.3g} of the largest value it covers) are zero; "
                    f"with input column 0 loud ({LOUD:g}, its weights zero) and the rest quiet "
                    f"({x[0, 1].abs().item():.3g}), at M={PROBE_ROWS} (a prefill batch) outputs of {bad_rows(bad)} "
                    f"are not zero: row {row} has max |y| {got[row].abs().max().item():.3g}, x W^T from unrounded "
                    f"activations {unrounded[row].abs().max().item():.3g}. Round activations as declared, or, if "
                    f"apply computes more accurately, declare conformance_requirements "
                    f"{{'rounds_declared_activations': False}}")
