"""MoEExecutorConformance: ``apply`` against the interface's formula computed per token (explicit cases, which also
judge ``eager``) and against the ``eager`` oracle (small shapes, and batches from 1 to a few
hundred tokens over up to 64 experts with skewed routing, crossing executors' batch-size thresholds), dropped
slots, bad shapes; for executors declaring the ``fp8_channel`` expert weight format, the same checks with fp8
weights + per-row scales against ``eager`` on the dequantized weights, and malformed scales."""
from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from nanocore.builtin.eager_moe import EagerMoEExecutor
from nanocore.interfaces import WEIGHT_FORMATS
from nanocore.toolkit.moe_weights import dequantize_fp8_experts, quantize_fp8_experts
from nanocore_conformance.base import (MAX_EXAMPLES, assert_close, check_tolerance_declaration, generator, randn,
                                       suite_settings)
from nanocore_conformance.contract import BackendContractConformance
from nanocore_conformance.moe_dense import DENSE_SHAPES, dense_case, dense_moe

moe_shapes = st.fixed_dictionaries({
    "tokens": st.one_of(st.just(1), st.integers(1, 12)),
    "experts": st.integers(1, 6),
    "top_k": st.integers(1, 3),
    "hidden_units": st.integers(1, 4),
    "intermediate_units": st.integers(1, 4),
    "dropped": st.booleans(),  # some slots routed to no expert (id -1 or >= E)
})

#: Batches an executor may treat differently (tile sizes, chunking, a grouped path above some M): 1 to a few hundred
#: tokens, up to 64 experts (past 32: ids that do not fit 5 bits), top_k up to 8, routing from even to one hot
#: expert with others idle. Hidden and intermediate stay small, so interpreted Triton kernels stay cheap.
batch_shapes = st.fixed_dictionaries({
    "tokens": st.one_of(st.integers(1, 4), st.integers(5, 320)),
    "experts": st.sampled_from([2, 8, 33, 64]),
    "top_k": st.sampled_from([1, 2, 4, 8]),
    "skew": st.sampled_from([0.0, 0.5, 2.0]),
    "dropped": st.booleans(),
})
# a few costly examples each: shrinking would rerun the kernels hundreds of times, and the failure names the shape
batch_settings = settings(suite_settings, max_examples=max(1, MAX_EXAMPLES // 3),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate], report_multiple_bugs=False)


def skewed_routing(shape, g: torch.Generator) -> torch.Tensor:
    """``topk_ids [M, K]``: distinct experts per token (when K <= E) drawn with popularity ``exp(-skew * e)``,
    so with skew some experts get most slots and others none."""
    m, e, k = shape["tokens"], shape["experts"], shape["top_k"]
    popularity = torch.exp(-shape["skew"] * torch.arange(e, dtype=torch.float32))
    popularity = popularity[torch.randperm(e, generator=g)]
    ids = torch.multinomial(popularity.expand(m, e), k, replacement=k > e, generator=g)
    if shape["dropped"]:
        drop = torch.rand(m, k, generator=g) < 0.2
        ids = torch.where(drop, torch.where(torch.rand(m, k, generator=g) < 0.5, -1, e), ids)
    return ids


def moe_case(shape, hidden_multiple, intermediate_multiple, dtype, device, seed):
    """Random routed tokens and expert weights; ``topk_ids`` may repeat and may point at no expert."""
    m, e, k = shape["tokens"], shape["experts"], shape["top_k"]
    h, i = shape.get("hidden_units", 2) * hidden_multiple, shape.get("intermediate_units", 2) * intermediate_multiple
    g = generator(seed)
    x = randn(m, h, seed_gen=g, dtype=dtype, device=device)
    topk_weights = torch.rand(m, k, generator=g)
    if shape.get("renormalize"):  # the router's top-k renormalised to sum 1 (else raw probabilities)
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    topk_weights = topk_weights.to(dtype=dtype, device=device)
    topk_ids = torch.randint(0, e, (m, k), generator=g)
    if "skew" in shape:
        topk_ids = skewed_routing(shape, g)
    elif shape["dropped"]:
        drop = torch.rand(m, k, generator=g) < 0.4
        topk_ids = torch.where(drop, torch.where(torch.rand(m, k, generator=g) < 0.5, -1, e), topk_ids)
    w13 = randn(e, 2 * i, h, seed_gen=g, dtype=dtype, device=device, scale=h ** -0.5)
    w2 = randn(e, h, i, seed_gen=g, dtype=dtype, device=device, scale=i ** -0.5)
    return x, topk_weights, topk_ids.to(device), w13, w2


#: Token counts on each side of sizes executors switch at (GEMV, 16- to 256-row tiles), each with top_k 1..8 and the
#: router's weights renormalised or not, pairwise: explicit cases on every run.
BOUNDARY_TOKENS = (1, 2, 16, 17, 64, 65, 128, 129, 256, 257)


def boundary_moe_shapes(thresholds=()) -> list[dict]:
    tokens = sorted({*BOUNDARY_TOKENS, *(m for t in thresholds for m in (t - 1, t, t + 1) if m >= 1)})
    return [{"tokens": m, "experts": (8, 64)[i % 2], "top_k": (1, 2, 4, 8)[i % 4], "skew": (0.0, 2.0)[i // 2 % 2],
             "dropped": i % 3 == 0, "renormalize": i // 4 % 2 == 0} for i, m in enumerate(tokens)]


def fp8_channel_case(args, seed: int):
    """``moe_case`` args with fp8 experts: ``(fp8 args, scales kwargs, oracle args on the dequantized weights)``.

    Rows are first scaled by random factors in [1/4, 4], so the per-row scales differ (a scale applied to the wrong
    rows or columns, or one gate / up scale for both, shows)."""
    x, topk_weights, topk_ids, w13, w2 = args
    g = generator(seed + 1)

    def row_gain(t):
        return t.float() * torch.exp2(torch.rand(t.shape[:2], generator=g) * 4 - 2)[..., None].to(t.device)
    q13, s13, q2, s2 = quantize_fp8_experts(row_gain(w13), row_gain(w2))
    d13, d2 = dequantize_fp8_experts(q13, q2, s13, s2, x.dtype)
    return (x, topk_weights, topk_ids, q13, q2), {"w13_scale": s13, "w2_scale": s2}, (x, topk_weights, topk_ids,
                                                                                        d13, d2)


class MoEExecutorConformance(BackendContractConformance):
    kind = "moe_executor"
    #: Requirements: multiples the executor needs for hidden (H) and intermediate (I) sizes.
    hidden_multiple: ClassVar[int] = 8
    intermediate_multiple: ClassVar[int] = 8
    #: Token counts at which the executor switches strategies: each side of each gets a boundary case.
    token_thresholds: ClassVar[tuple[int, ...]] = ()
    requirement_names = ("hidden_multiple", "intermediate_multiple", "token_thresholds")

    def _check(self, backend_cls, options, dtype, device, shape, seed, activation, weight_format="float"):
        args = oracle_args = moe_case(shape, self.hidden_multiple, self.intermediate_multiple, dtype, device, seed)
        scales = {}
        if weight_format == "fp8_channel":
            args, scales, oracle_args = fp8_channel_case(args, seed)
        out = backend_cls(options).apply(*args, activation=activation, **scales)
        assert out.dtype == dtype, f"apply returned {out.dtype}, expected x.dtype {dtype}"
        expected = EagerMoEExecutor().apply(*oracle_args, activation=activation)
        if dtype != torch.float32:
            # eager in bf16 rounds every expert's output: an executor that rounds less may be nearer to eager in
            # float32 (on the same rounded inputs); each element may match either
            x, topk_weights, topk_ids, w13, w2 = (t if t is oracle_args[2] else t.float() for t in oracle_args)
            exact = EagerMoEExecutor().apply(x, topk_weights, topk_ids, w13, w2, activation=activation)
            nearer = (out.float() - exact).abs() < (out.float() - expected.float()).abs()
            expected = torch.where(nearer, exact, expected.float())
        where = (f"M={args[0].shape[0]} tokens, E={args[3].shape[0]} experts, top_k={args[2].shape[1]}"
                 f"{', weights renormalised' if shape.get('renormalize') else ''}")
        # fp8 rows carry gains up to 4x in both layers: outputs (and every bf16 rounding inside) grow with them, so
        # the absolute tolerance follows the output's rms (an element that cancels to near 0 keeps its terms' error)
        atol_scale = max(1.0, float(expected.float().pow(2).mean().sqrt())) if weight_format != "float" else 1.0
        assert_close(out, expected, backend_cls.tolerance,
                     f"{self.backend} MoE ({activation}, {weight_format} experts, {where}) vs eager", atol_scale)

    def _skip_unless_fp8_channel(self, backend_cls, options, device):
        if "fp8_channel" not in backend_cls.weight_formats:
            pytest.skip(f"{backend_cls.__name__} declares expert weight formats {list(backend_cls.weight_formats)}, "
                        f"not 'fp8_channel'")
        reason = backend_cls(options).supports_weight_format("fp8_channel", device)
        if reason:
            pytest.skip(f"fp8_channel experts on {device}: {reason}")

    def test_tolerance_declared(self, backend_cls):
        check_tolerance_declaration(backend_cls)
        unknown = set(backend_cls.activations) - set(EagerMoEExecutor.activations)
        assert not unknown, f"activations {sorted(unknown)} have no oracle in 'eager'; add them there first"
        formats = tuple(backend_cls.weight_formats)
        assert "float" in formats, f"weight_formats {formats} must include 'float' (the core's default)"
        assert set(formats) <= set(WEIGHT_FORMATS), f"weight_formats {formats}: nanocore knows {list(WEIGHT_FORMATS)}"

    @suite_settings
    @given(shape=moe_shapes, seed=st.integers(0, 2**31 - 1), data=st.data())
    def test_apply_matches_eager(self, backend_cls, backend_options, dtype, device, shape, seed, data):
        activation = data.draw(st.sampled_from(list(backend_cls.activations)))
        self._check(backend_cls, backend_options, dtype, device, shape, seed, activation)

    def test_token_count_boundaries_match_eager(self, backend_cls, backend_options, dtype, device):
        for seed, shape in enumerate(boundary_moe_shapes(self.token_thresholds)):
            activation = backend_cls.activations[seed % len(backend_cls.activations)]
            self._check(backend_cls, backend_options, dtype, device, shape, seed, activation)

    def test_explicit_cases_match_the_formula(self, backend_cls, backend_options, dtype, device):
        executor = backend_cls(backend_options)
        hidden, intermediate = 2 * self.hidden_multiple, 2 * self.intermediate_multiple
        for seed, (m, e, k, renormalise) in enumerate(DENSE_SHAPES):
            activation = backend_cls.activations[seed % len(backend_cls.activations)]
            args = dense_case(m, e, k, renormalise, hidden, intermediate, dtype, device, seed)
            out = executor.apply(*args, activation=activation)
            expected = dense_moe(*args, activation)
            if dtype != torch.float32:  # eager in dtype rounds every expert's output: each element may match either
                rounded = EagerMoEExecutor().apply(*args, activation=activation).double().cpu()
                got = out.double().cpu()
                expected = torch.where((got - rounded).abs() < (got - expected).abs(), rounded, expected)
            assert_close(out, expected, backend_cls.tolerance,
                         f"{self.backend} MoE ({activation}, M={m} tokens, E={e} experts, top_k={k}, ids "
                         f"{args[2].tolist()}, weights {'renormalised' if renormalise else 'raw'}) vs the formula "
                         f"sum_k w[m,k] * w2[e] @ (act(gate) * up) computed per token in float64")

    @batch_settings
    @given(shape=batch_shapes, seed=st.integers(0, 2**31 - 1))
    @example(shape={"tokens": 300, "experts": 8, "top_k": 2, "skew": 0.0, "dropped": False}, seed=0)  # 75 rows/expert
    @example(shape={"tokens": 97, "experts": 64, "top_k": 8, "skew": 2.0, "dropped": True}, seed=1)  # hot and idle
    def test_batches_across_size_thresholds_match_eager(self, backend_cls, backend_options, dtype, device, shape, seed):
        activation = backend_cls.activations[seed % len(backend_cls.activations)]
        self._check(backend_cls, backend_options, dtype, device, shape, seed, activation)

    def test_tokens_routed_to_no_expert_contribute_nothing(self, backend_cls, backend_options, dtype, device):
        shape = {"tokens": 3, "experts": 2, "top_k": 2, "hidden_units": 1, "intermediate_units": 1, "dropped": False}
        x, weights, ids, w13, w2 = moe_case(shape, self.hidden_multiple, self.intermediate_multiple, dtype, device, 0)
        ids = torch.tensor([[-1, 2], [2, -1], [-1, -1]], device=device)
        out = backend_cls(backend_options).apply(x, weights, ids, w13, w2)
        assert torch.count_nonzero(out) == 0, "slots with ids < 0 or >= num_experts must contribute nothing"

    def test_bad_shapes_raise_value_error(self, backend_cls, backend_options, dtype, device):
        shape = {"tokens": 2, "experts": 2, "top_k": 1, "hidden_units": 1, "intermediate_units": 1, "dropped": False}
        x, weights, ids, w13, w2 = moe_case(shape, self.hidden_multiple, self.intermediate_multiple, dtype, device, 0)
        executor = backend_cls(backend_options)
        bad_cases = {
            "3-D x": (x[None], weights, ids, w13, w2),
            "x hidden != w13 hidden": (x[:, :-1], weights, ids, w13, w2),
            "topk shapes differ": (x, weights[:, :0], ids, w13, w2),
            "topk rows != tokens": (x, weights[:1], ids[:1], w13, w2),
            "w2 intermediate mismatch": (x, weights, ids, w13, w2[:, :, :-1]),
            "expert counts differ": (x, weights, ids, w13, w2[:1]),
        }
        for what, args in bad_cases.items():
            with pytest.raises(ValueError):
                executor.apply(*args)
                pytest.fail(f"apply accepted malformed input ({what}); raise ValueError (see check_moe_shapes)")
        with pytest.raises(ValueError):
            executor.apply(x, weights, ids, w13, w2, activation="no_such_activation")

    @suite_settings
    @given(shape=moe_shapes, seed=st.integers(0, 2**31 - 1))
    def test_fp8_channel_experts_match_eager_on_dequantized(self, backend_cls, backend_options, dtype, device, shape,
                                                             seed):
        self._skip_unless_fp8_channel(backend_cls, backend_options, device)
        activation = backend_cls.activations[seed % len(backend_cls.activations)]
        self._check(backend_cls, backend_options, dtype, device, shape, seed, activation, "fp8_channel")

    @batch_settings
    @given(shape=batch_shapes, seed=st.integers(0, 2**31 - 1))
    @example(shape={"tokens": 300, "experts": 8, "top_k": 2, "skew": 0.0, "dropped": False}, seed=0)
    @example(shape={"tokens": 97, "experts": 64, "top_k": 8, "skew": 2.0, "dropped": True}, seed=1)
    def test_fp8_channel_batches_across_size_thresholds(self, backend_cls, backend_options, dtype, device, shape,
                                                        seed):
        self._skip_unless_fp8_channel(backend_cls, backend_options, device)
        activation = backend_cls.activations[seed % len(backend_cls.activations)]
        self._check(backend_cls, backend_options, dtype, device, shape, seed, activation, "fp8_channel")

    def test_fp8_channel_bad_scales_raise_value_error(self, backend_cls, backend_options, dtype, device):
        self._skip_unless_fp8_channel(backend_cls, backend_options, device)
        shape = {"tokens": 2, "experts": 2, "top_k": 1, "hidden_units": 1, "intermediate_units": 1, "dropped": False}
        args = moe_case(shape, self.hidden_multiple, self.intermediate_multiple, dtype, device, 0)
        (x, weights, ids, w13, w2), scales, _ = fp8_channel_case(args, 0)
        s13, s2 = scales["w13_scale"], scales["w2_scale"]
        bad_cases = {
            "fp8 weights without scales": {},
            "only w13_scale": {"w13_scale": s13},
            "w13_scale of half the rows": {"w13_scale": s13[:, : s13.shape[1] // 2], "w2_scale": s2},
            "w2_scale [E, H, 1]": {"w13_scale": s13, "w2_scale": s2[..., None]},
        }
        executor = backend_cls(backend_options)
        for what, kwargs in bad_cases.items():
            with pytest.raises(ValueError):
                executor.apply(x, weights, ids, w13, w2, **kwargs)
                pytest.fail(f"apply accepted malformed fp8_channel input ({what}); raise ValueError "
                            f"(see nanocore.interfaces.moe_weight_format)")

    @pytest.mark.cuda
    @suite_settings
    @given(shape=moe_shapes, seed=st.integers(0, 2**31 - 1))
    def test_apply_matches_eager_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device, shape, seed):
        self._check(backend_cls, backend_options, cuda_dtype, cuda_device, shape, seed, backend_cls.activations[0])

    @pytest.mark.cuda
    @batch_settings
    @given(shape=batch_shapes, seed=st.integers(0, 2**31 - 1))
    def test_batches_across_size_thresholds_match_eager_on_cuda(self, backend_cls, backend_options, cuda_dtype,
                                                                cuda_device, shape, seed):
        self._check(backend_cls, backend_options, cuda_dtype, cuda_device, shape, seed, backend_cls.activations[0])

    @pytest.mark.cuda
    @batch_settings
    @given(shape=batch_shapes, seed=st.integers(0, 2**31 - 1))
    def test_fp8_channel_experts_match_eager_on_cuda(self, backend_cls, backend_options, cuda_dtype, cuda_device,
                                                     shape, seed):
        self._skip_unless_fp8_channel(backend_cls, backend_options, cuda_device)
        self._check(backend_cls, backend_options, cuda_dtype, cuda_device, shape, seed, backend_cls.activations[0],
                    "fp8_channel")
