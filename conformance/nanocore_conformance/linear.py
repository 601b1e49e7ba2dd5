"""LinearMethodConformance: a decoder layer's linears (merged q/k/v and gate/up, row-parallel o/down, simulated
tensor-parallel ranks) loaded from ``quantize``'s checkpoint tensors, against ``unquantized`` loaded the same way,
within the rounding noise of the scheme the method declares (``quant_scheme()``)."""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore.interfaces.quant_scheme import QuantScheme
from nanocore.layers.linear import RowParallelLinear
from nanocore_conformance.base import MAX_EXAMPLES, generator, randn, suite_settings
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.linear_activations import LinearActivationConformance
from nanocore_conformance.linear_boundaries import LinearBoundaryConformance, bad_rows
from nanocore_conformance.linear_calibration import LinearCalibrationConformance
from nanocore_conformance.linear_checkpoints import LinearCheckpointConformance
from nanocore_conformance.linear_formats import CLAIMED_WRITERS, WRITERS
from nanocore_conformance.linear_layers import (  # noqa: F401  (quantize_layer, method_options: public here too)
    ROW_PARALLEL, LayerShape, build_layers, checkpoint_weights, load_checkpoint, method_options,
    quantize_layer, random_activations)
from nanocore_conformance.linear_legacy import legacy_allowed, legacy_tolerance
from nanocore_conformance.quant_noise import NOISE_SIGMAS, float_slack, predicted_std, weight_step

# each example is a whole decoder layer (four layers, up to two ranks): fewer examples, and no shrinking, which
# would rerun it hundreds of times (the failure names the layer, rank and shape)
layer_settings = settings(suite_settings, max_examples=max(1, MAX_EXAMPLES // 2),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate], report_multiple_bugs=False)
#: (num_heads, num_kv_heads): MHA, GQA, and one KV head replicated over two TP ranks
HEADS = [(2, 2), (2, 1), (4, 2), (4, 1), (4, 4)]


def copy_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor, *args, **kwargs) -> None:
    """The simplest layer-side loader: one unsharded tensor per parameter (for plugins' own single-layer tests)."""
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ValueError(f"checkpoint tensor {tuple(loaded_weight.shape)} does not fit parameter {tuple(param.shape)}")
    param.data.copy_(loaded_weight)


def build_layer(method, weight: torch.Tensor, partitions: list[int], dtype, device) -> torch.nn.Module:
    """One plain layer: create_weights, ``quantize({"weight": W})`` loaded with ``copy_weight_loader``, process."""
    layer = torch.nn.Module()
    with torch.device(device):
        method.create_weights(layer, weight.shape[1], list(partitions), weight.shape[1], sum(partitions), dtype,
                              copy_weight_loader)
    try:
        tensors, _config = type(method).quantize({"weight": weight.to(dtype)})
    except NotImplementedError:
        tensors = {"weight": weight.to(dtype)}
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor.to(device))
    method.process_weights_after_loading(layer)
    return layer


class LinearMethodConformance(LinearBoundaryConformance, LinearCheckpointConformance, LinearCalibrationConformance,
                              LinearActivationConformance, BackendContractConformance):
    kind = "linear_method"
    #: Requirements: multiples the backend needs for input_size (K) and each output partition (N).
    input_size_multiple: ClassVar[int] = 1
    output_size_multiple: ClassVar[int] = 1
    #: M values at which the backend switches kernels: each side of each gets a boundary case.
    m_thresholds: ClassVar[tuple[int, ...]] = ()
    requirement_names = ("input_size_multiple", "output_size_multiple", "m_thresholds", "rounds_declared_activations")

    def multiples(self, backend_cls) -> tuple[int, int]:
        """(K multiple, N multiple): the backend's declared ``conformance_requirements`` win over the class's."""
        declared = getattr(backend_cls, "conformance_requirements", {})
        return (declared.get("input_size_multiple", self.input_size_multiple),
                declared.get("output_size_multiple", self.output_size_multiple))

    def layer_shape(self, backend_cls, draw: dict) -> LayerShape:
        k_multiple, n_multiple = self.multiples(backend_cls)
        unit = math.lcm(k_multiple, n_multiple)
        sized = lambda units, limit: unit * (1 + units % max(2, limit // unit))
        heads, kv_heads = draw["heads"]
        return LayerShape(hidden=sized(draw["hidden"], 160), head_dim=sized(draw["head_dim"], 24),
                          num_heads=heads, num_kv_heads=kv_heads,
                          intermediate=draw["tp_size"] * sized(draw["intermediate"], 96), qkv_bias=draw["qkv_bias"])

    layer_draws = st.fixed_dictionaries({
        "tp_size": st.sampled_from([1, 2]),
        "heads": st.sampled_from(HEADS),
        "hidden": st.integers(0, 200), "head_dim": st.integers(0, 200), "intermediate": st.integers(0, 200),
        "leading": st.lists(st.integers(1, 9), min_size=1, max_size=2),  # x is [M, K] or [B, M, K]
        "qkv_bias": st.booleans(),
    })

    @staticmethod
    def _checkpoint(backend_cls, options, weights, writer):
        """(tensors, method options, scheme to predict the noise with): from ``quantize``, or from ``writer``
        (a checkpoint made elsewhere: its weights rounded as the writer says, activations as the method declares)."""
        if writer is None:
            tensors, config = quantize_layer(backend_cls, weights)
            options = method_options(options, config)
            return tensors, options, backend_cls(options).quant_scheme()
        tensors, config, weight_args = writer(weights, backend_cls(dict(options)).quant_scheme())
        options = method_options(options, config)
        declared = backend_cls(options).quant_scheme()
        return tensors, options, QuantScheme(weights=weight_args,
                                             input_activations=declared.input_activations if declared else None)

    def _check_layer_against_oracle(self, backend_cls, options, dtype, device, draw, seed, writer=None):
        shape = self.layer_shape(backend_cls, draw)
        g = generator(seed)
        weights = {n: t.to(dtype) for n, t in checkpoint_weights(shape, g).items()}
        tensors, options, scheme = self._checkpoint(backend_cls, options, weights, writer)
        steps = {n: weight_step(t, scheme) for n, t in weights.items() if n.endswith("proj.weight")}
        no_bias = dataclasses.replace(shape, qkv_bias=False)
        x_in = {"hidden": random_activations(*draw["leading"], shape.hidden, g=g),
                "o_proj": random_activations(*draw["leading"], shape.num_heads * shape.head_dim, g=g),
                "down_proj": random_activations(*draw["leading"], shape.intermediate, g=g)}
        if draw.get("outlier_channel"):  # one channel 64x louder in every token, as LLM hidden states have
            for x in x_in.values():
                x[..., 0] *= 64
        tp = draw["tp_size"]
        for rank in range(tp):
            layers = build_layers(lambda: backend_cls(dict(options)), shape, rank, tp, dtype, device)
            load_checkpoint(layers, tensors, device, self.backend)
            oracles = build_layers(UnquantizedLinearMethod, shape, rank, tp, dtype, device)
            load_checkpoint(oracles, weights, device, "unquantized")
            step_layers = build_layers(UnquantizedLinearMethod, no_bias, rank, tp, torch.float64, "cpu")
            load_checkpoint(step_layers, steps, "cpu", "steps")
            for name, layer in layers.items():
                x = x_in.get(name, x_in["hidden"])
                x = x.chunk(tp, dim=-1)[rank] if name in ROW_PARALLEL else x
                made_by = f", a checkpoint as {writer.__name__} writes it" if writer else ""
                where = f"{name} (tp rank {rank} of {tp}, {shape}{made_by})"
                self._compare(layer, oracles[name], step_layers[name].weight, x.to(dtype=dtype, device=device),
                              scheme, where)

    def _compare(self, layer, oracle, step_w, x, scheme, where, check_gain=True):
        bias = None if isinstance(layer, RowParallelLinear) else oracle.bias  # added after the all-reduce
        out = layer.linear_method.apply(layer, x, None if bias is None else layer.bias)
        expected = oracle.linear_method.apply(oracle, x, bias)
        assert out.dtype == x.dtype, f"{where}: apply returned {out.dtype}, expected the input dtype {x.dtype}"
        assert out.shape == expected.shape, (
            f"{where}: apply returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
        x2, weight = x.reshape(-1, x.shape[-1]).float().cpu(), oracle.weight.float().cpu()
        got, want = out.reshape(x2.shape[0], -1).double().cpu(), expected.reshape(x2.shape[0], -1).double().cpu()
        std = predicted_std(x2, weight, step_w, scheme)
        allowed = NOISE_SIGMAS * std + float_slack(x2, weight, want, x.dtype)
        legacy = legacy_tolerance(type(layer.linear_method))
        if legacy is not None:
            allowed = allowed + legacy_allowed(x2, weight, want, legacy)
        err = (got - want).abs()
        bad = ~(err <= allowed)  # NaN counts as bad
        if bad.any():
            worst = int(torch.nan_to_num(err / allowed, nan=float("inf")).flatten().argmax())
            m, n = divmod(worst, err.shape[1])
            rule = (f"quant_scheme() {scheme} allows {NOISE_SIGMAS} x the predicted rounding std" if scheme is not None
                    else f"API 1.0's tolerance {legacy}, atol relative to max |x| |W|^T" if legacy is not None
                    else "quant_scheme() is None (no rounding): apply must match at float accuracy")
            raise AssertionError(
                f"{where}: {int(bad.sum())} of {bad.numel()} outputs ({bad_rows(bad)} of M={bad.shape[0]}) differ from "
                f"unquantized beyond what the format allows ({rule}); worst at row {m}, column {n}: got {got[m, n].item():.6g}, expected "
                f"{want[m, n].item():.6g}, allowed +-{allowed[m, n].item():.3g} "
                f"(predicted std {std[m, n].item():.3g}). "
                f"Check the weight_loader's merged-shard offsets and TP slices, scales and zero points; if apply is "
                f"right, quant_scheme() understates how the method rounds.")
        if legacy is None and check_gain:  # API 1.0's rule had no gain check
            self._check_gain(got - want, want - (0 if bias is None else bias.double().cpu()), std, x.dtype, where)

    @staticmethod
    def _check_gain(err, product, std, dtype, where):
        """Rounding noise is uncorrelated with ``x W^T``; a scale a little off is not: regress the error on it."""
        norm = (product ** 2).sum()
        if norm == 0:
            return
        gain = float((err * product).sum() / norm)
        allowed = NOISE_SIGMAS * float((std ** 2 * product ** 2).sum().sqrt() / norm) + 2 * torch.finfo(dtype).eps
        assert abs(gain) <= allowed, (
            f"{where}: the output is x W^T times {1 + gain:.5f} (a systematic {gain:+.3%}, beyond the +-{allowed:.3%} "
            f"rounding noise allows); a scale is off (dequantization factor, scale dtype or a scale applied twice)")

    @layer_settings
    @given(draw=layer_draws, seed=st.integers(0, 2**31 - 1))
    def test_decoder_layer_matches_unquantized(self, backend_cls, backend_options, dtype, device, draw, seed):
        self._check_layer_against_oracle(backend_cls, backend_options, dtype, device, draw, seed)

    #: layers for checkpoints made elsewhere: two TP ranks with GQA and q/k/v bias; one rank, one KV head; one rank
    #: with a loud channel (rounding activations the checkpoint leaves unrounded then wipes out the quiet ones) and
    #: every input size a multiple of 4 (int8 packed four to a word)
    reference_draws = ({"tp_size": 2, "heads": (4, 2), "hidden": 47, "head_dim": 16, "intermediate": 24,
                        "leading": [5], "qkv_bias": True},
                       {"tp_size": 1, "heads": (2, 1), "hidden": 20, "head_dim": 7, "intermediate": 33,
                        "leading": [2, 3], "qkv_bias": False},
                       {"tp_size": 1, "heads": (2, 2), "hidden": 39, "head_dim": 7, "intermediate": 15,
                        "leading": [7], "qkv_bias": False, "outlier_channel": True})

    def test_loads_checkpoints_made_elsewhere(self, backend_cls, backend_options, dtype, device):
        declared = backend_cls(dict(backend_options)).quant_scheme()
        writers = [(w, self.reference_draws) for w in WRITERS.get(backend_cls.quant_method, ())
                   if w({}, declared) is not None]
        writers += [(w, self.reference_draws[2:]) for w in CLAIMED_WRITERS.get(backend_cls.quant_method, ())
                    if w({}, declared) is not None and backend_cls.checkpoint_support(w({}, declared)[1]) is None]
        if backend_cls.quant_method is None:
            pytest.skip("plain checkpoints (quant_method None): the decoder-layer check loads them")
        if not writers:
            pytest.skip(f"the suite writes no {backend_cls.quant_method!r} checkpoint with scheme {declared} "
                        f"(it writes {sorted(WRITERS)}: fp8 per channel / per tensor, AutoAWQ GEMM, "
                        f"compressed-tensors int8 per channel, and channel-wise W8A16 for methods claiming it)")
        for writer, draws in writers:
            for seed, draw in enumerate(draws):
                self._check_layer_against_oracle(backend_cls, backend_options, dtype, device, draw, seed, writer)

    def test_quant_scheme_declared(self, backend_cls, backend_options):
        scheme = backend_cls(dict(backend_options)).quant_scheme()
        assert scheme is None or isinstance(scheme, QuantScheme), (
            f"quant_scheme() must return a QuantScheme (nanocore.interfaces) or None, got {scheme!r}")

    def _small_layers(self, backend_cls, backend_options, dtype, device, sign: float = 1.0):
        """The smallest decoder layer the backend allows, loaded from ``quantize`` (weights times ``sign``)."""
        draw = {"tp_size": 1, "heads": (2, 2), "hidden": 1, "head_dim": 1, "intermediate": 1, "qkv_bias": False}
        shape = self.layer_shape(backend_cls, draw)
        weights = {n: t * sign for n, t in checkpoint_weights(shape, generator(7)).items()}
        tensors, config = quantize_layer(backend_cls, weights)
        options = method_options(backend_options, config)
        layers = build_layers(lambda: backend_cls(dict(options)), shape, 0, 1, dtype, device)
        load_checkpoint(layers, tensors, device, self.backend)
        return layers, shape

    def test_loaded_weights_change_the_output(self, backend_cls, backend_options, dtype, device):
        outs = []
        for sign in (1.0, -1.0):
            layers, shape = self._small_layers(backend_cls, backend_options, dtype, device, sign)
            x = randn(3, shape.hidden, seed_gen=generator(1), dtype=dtype, device=device)
            outs.append(layers["qkv_proj"].linear_method.apply(layers["qkv_proj"], x, None).float())
        assert not torch.allclose(outs[0], outs[1]), (
            "apply ignores the loaded weights (negated weights gave the same output)")

    def test_wrong_input_size_is_an_error(self, backend_cls, backend_options, dtype, device):
        layers, shape = self._small_layers(backend_cls, backend_options, dtype, device)
        x = randn(2, shape.hidden + 1, seed_gen=generator(1), dtype=dtype, device=device)
        with pytest.raises((ValueError, RuntimeError)) as info:
            layers["qkv_proj"].linear_method.apply(layers["qkv_proj"], x, None)
        assert str(info.value).strip(), "the error for a wrong input size must say what is wrong"

    @pytest.mark.cuda
    @layer_settings
    @given(draw=layer_draws, seed=st.integers(0, 2**31 - 1))
    def test_decoder_layer_matches_unquantized_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device,
                                                       draw, seed):
        self._check_layer_against_oracle(backend_cls, backend_options, cuda_dtype, cuda_device, draw, seed)
