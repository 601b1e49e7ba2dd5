"""LinearMethodConformance: create_weights / weight_loader / process / apply against ``unquantized``."""
from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nanocore.builtin.unquantized_linear import UnquantizedLinearMethod
from nanocore_conformance.base import assert_close, check_tolerance_declaration, generator, randn, suite_settings
from nanocore_conformance.contract import BackendContractConformance


def copy_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor, *args, **kwargs) -> None:
    """The simplest layer-side loader: one unsharded tensor per parameter."""
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ValueError(f"checkpoint tensor {tuple(loaded_weight.shape)} does not fit parameter {tuple(param.shape)}")
    param.data.copy_(loaded_weight)


def checkpoint_tensors(cls: type, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a checkpoint of this method holds for ``weight``: ``quantize`` output, else the weight itself."""
    try:
        tensors, _config = cls.quantize({"weight": weight})
    except NotImplementedError:
        tensors = {"weight": weight}
    return tensors


def build_layer(method, weight: torch.Tensor, partitions: list[int], dtype, device) -> torch.nn.Module:
    """create_weights -> weight_loader for every checkpoint tensor -> process_weights_after_loading."""
    layer = torch.nn.Module()
    input_size = weight.shape[1]
    with torch.device(device):
        method.create_weights(layer, input_size, list(partitions), input_size, sum(partitions), dtype,
                              copy_weight_loader)
    for name, tensor in checkpoint_tensors(type(method), weight.to(dtype)).items():
        param = getattr(layer, name, None)
        assert isinstance(param, torch.Tensor), (
            f"checkpoint tensor {name!r} (from quantize) has no parameter {name!r} registered by create_weights")
        loader = getattr(param, "weight_loader", None)
        assert loader is not None, f"parameter {name!r} has no weight_loader; attach it with set_weight_attrs"
        loader(param, tensor.to(device))
    method.process_weights_after_loading(layer)
    return layer


class LinearMethodConformance(BackendContractConformance):
    kind = "linear_method"
    #: Requirements: multiples the backend needs for input_size (K) and each output partition (N).
    input_size_multiple: ClassVar[int] = 1
    output_size_multiple: ClassVar[int] = 1

    def multiples(self, backend_cls) -> tuple[int, int]:
        """(K multiple, N multiple): the backend's declared ``conformance_requirements`` win over the class's."""
        declared = getattr(backend_cls, "conformance_requirements", {})
        return (declared.get("input_size_multiple", self.input_size_multiple),
                declared.get("output_size_multiple", self.output_size_multiple))

    def _check_against_oracle(self, backend_cls, options, dtype, device, shape, seed):
        leading, k_units, n_units, use_bias = shape
        k_multiple, n_multiple = self.multiples(backend_cls)
        k = k_units * k_multiple
        partitions = [n * n_multiple for n in n_units]
        g = generator(seed)
        weight = randn(sum(partitions), k, seed_gen=g, scale=k ** -0.5)
        x = randn(*leading, k, seed_gen=g, dtype=dtype, device=device)
        bias = randn(sum(partitions), seed_gen=g, dtype=dtype, device=device) if use_bias else None
        method = backend_cls(options)
        layer = build_layer(method, weight, partitions, dtype, device)
        oracle = UnquantizedLinearMethod()
        oracle_layer = build_layer(oracle, weight, partitions, dtype, device)
        out = method.apply(layer, x, bias)
        expected = oracle.apply(oracle_layer, x, bias)
        assert out.dtype == dtype, f"apply returned {out.dtype}, expected the input dtype {dtype}"
        # quantization error scales with sum |x||W| (not with the output, which a bias can cancel to ~0)
        gemm_scale = (x.float().abs().reshape(-1, k) @ weight.float().abs().t().to(x.device)).max()
        assert_close(out, expected, backend_cls.tolerance, f"{self.backend} apply vs unquantized",
                     atol_scale=float(gemm_scale))

    shapes = st.tuples(
        st.lists(st.integers(1, 9), min_size=1, max_size=2),  # leading dims of x (M, or B x M)
        st.integers(1, 6),  # K in units of input_size_multiple
        st.lists(st.integers(1, 5), min_size=1, max_size=3),  # output partitions (merged qkv / gate_up)
        st.booleans(),  # bias
    )

    def test_tolerance_declared(self, backend_cls):
        check_tolerance_declaration(backend_cls)

    @suite_settings
    @given(shape=shapes, seed=st.integers(0, 2**31 - 1))
    def test_apply_matches_unquantized(self, backend_cls, backend_options, dtype, device, shape, seed):
        self._check_against_oracle(backend_cls, backend_options, dtype, device, shape, seed)

    def test_loaded_weights_change_the_output(self, backend_cls, backend_options, dtype, device):
        k_multiple, n_multiple = self.multiples(backend_cls)
        k, n = 4 * k_multiple, 2 * n_multiple
        g = generator(1)
        x = randn(3, k, seed_gen=g, dtype=dtype, device=device)
        outs = []
        for scale in (1.0, -1.0):
            weight = randn(n, k, seed_gen=generator(7), scale=scale)
            method = backend_cls(backend_options)
            outs.append(method.apply(build_layer(method, weight, [n], dtype, device), x, None).float())
        assert not torch.allclose(outs[0], outs[1]), "apply ignores the loaded weights (negated weights gave the same output)"

    def test_wrong_input_size_is_an_error(self, backend_cls, backend_options, dtype, device):
        k_multiple, n_multiple = self.multiples(backend_cls)
        k, n = 2 * k_multiple, n_multiple
        method = backend_cls(backend_options)
        layer = build_layer(method, randn(n, k, seed_gen=generator(0)), [n], dtype, device)
        x = randn(2, k + 1, seed_gen=generator(1), dtype=dtype, device=device)
        with pytest.raises((ValueError, RuntimeError)) as info:
            method.apply(layer, x, None)
        assert str(info.value).strip(), "the error for a wrong input size must say what is wrong"

    @pytest.mark.cuda
    @suite_settings
    @given(shape=shapes, seed=st.integers(0, 2**31 - 1))
    def test_apply_matches_unquantized_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device, shape, seed):
        self._check_against_oracle(backend_cls, backend_options, cuda_dtype, cuda_device, shape, seed)
