"""Per-batch integers of every kernel launched per step are ``do_not_specialize`` (no compile for a
first-seen batch shape). A new launched kernel fails ``test_every_launched_kernel_is_declared`` until it is
listed below with the integers that change from step to step."""
from __future__ import annotations

import importlib
import inspect
import re

import pytest

pytest.importorskip("triton")

#: (module, kernel) -> the integer parameters that vary per batch or step (token / row / sequence counts, q tiles,
#: KV splits, the block-table width). The rest are fixed by the model, the cache or the layer (strides, N, K).
PER_BATCH = {
    ("nanocore.kernels.paged_attention_kernel", "paged_attention_kernel"): {"num_q_tiles", "num_splits", "stride_bt"},
    ("nanocore.kernels.split_kv", "merge_splits_kernel"): {"num_splits"},
    ("nanocore.kernels.rmsnorm", "_rms_norm_tile_kernel"): {"num_rows"},
    ("nanocore.kernels.rmsnorm", "_rms_norm_loop_kernel"): set(),  # rows in the grid only
    ("nanocore.kernels.kv_store", "store_kv_kernel"): set(),  # tokens in the grid only
    ("nanocore.kernels.activation", "silu_and_mul_kernel"): set(),
    ("nanocore.kernels.rotary", "rotary_kernel"): set(),
    ("nanocore.kernels.sampling", "_gumbel_argmax_chunk_kernel"): set(),  # rows in the grid; vocab fixed
    ("nanocore.toolkit.gemm", "_wo_splitk_kernel"): {"M"},
    ("nanocore.toolkit.gemm", "_weight_gemm_kernel"): {"M"},
    ("nanocore.toolkit.gemv", "_gemv_kernel"): set(),  # M = 1 only
    ("nanocore.toolkit.gemm_block", "_block_scaled_kernel"): {"M"},
    ("nanocore.toolkit.act_quant", "_per_token_quant_kernel"): set(),  # rows in the grid; K fixed per layer
    ("nanocore_awq.kernels", "_awq_splitk_kernel"): {"M"},
    ("nanocore.toolkit.gemm_mma", "_mma_channel_kernel"): {"M"},
    ("nanocore.toolkit.gemm_mma", "_dequant_channel_kernel"): set(),  # weight shape only
    ("nanocore.toolkit.gemm_int4", "_awq_mma_kernel"): {"M"},
    ("nanocore.toolkit.gemm_int4", "_awq_dequant_kernel"): set(),  # weight shape only
    ("nanocore_triton_fused_moe.kernels", "gate_up_silu_kernel"): {"num_blocks", "num_slots"},
    ("nanocore_triton_fused_moe.kernels", "down_kernel"): {"num_blocks", "num_slots"},
}
#: Pointers that arrive at a per-step offset (so their 16-byte alignment varies): not specialised on alignment.
PER_STEP_OFFSET = {("nanocore.kernels.kv_store", "store_kv_kernel"): {"slot_ptr"}}
#: Names that mean "changes with the batch" wherever they appear as a runtime integer.
PER_BATCH_NAMES = re.compile(r"^(M|num_(rows|tokens|seqs|q_tiles|splits|blocks|slots)|max_\w+|stride_bt)$")


def _module(name):
    return pytest.importorskip(name)


def _kernel(module_name: str, name: str):
    module = _module(module_name)
    if module_name == "nanocore_triton_fused_moe.kernels":  # wrapped per device kind at first use
        return dict(zip(("gate_up_silu_kernel", "down_kernel"), module._compiled(False)))[name]
    return getattr(module, name)


def _do_not_specialize(kernel) -> set[str]:
    raw = getattr(kernel, "do_not_specialize", None)
    if raw is None:  # the interpreter's wrapper keeps the decorator's arguments
        raw = kernel.kwargs.get("do_not_specialize") or []
    return {kernel.arg_names[x] if isinstance(x, int) else x for x in raw}


def _no_alignment(kernel) -> set[str]:
    raw = getattr(kernel, "do_not_specialize_on_alignment", None)
    if raw is None:
        raw = kernel.kwargs.get("do_not_specialize_on_alignment") or []
    return {kernel.arg_names[x] if isinstance(x, int) else x for x in raw} | _do_not_specialize(kernel)


def _runtime_params(kernel) -> list[str]:
    params = inspect.signature(kernel.fn).parameters.values()
    return [p.name for p in params if "constexpr" not in str(p.annotation)]


def _is_jitted(obj) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction")


@pytest.mark.parametrize("module_name,name", sorted(PER_STEP_OFFSET))
def test_pointers_at_a_per_step_offset_are_not_specialised_on_alignment(module_name, name):
    kernel = _kernel(module_name, name)
    assert PER_STEP_OFFSET[module_name, name] <= _no_alignment(kernel)


@pytest.mark.parametrize("module_name,name", sorted(PER_BATCH))
def test_per_batch_integers_are_not_specialised(module_name, name):
    kernel = _kernel(module_name, name)
    dns = _do_not_specialize(kernel)
    unknown = dns - set(kernel.arg_names)
    assert not unknown, f"{name}: do_not_specialize names unknown parameters {unknown}"
    missing = PER_BATCH[module_name, name] - dns
    assert not missing, f"{name}: {sorted(missing)} change per batch; add them to do_not_specialize"
    named = {p for p in _runtime_params(kernel) if PER_BATCH_NAMES.match(p)}
    assert named <= dns, f"{name}: {sorted(named - dns)} look per-batch; do_not_specialize them or rename"


def _launched(module) -> set[tuple[str, str]]:
    """(defining module, name) of the jitted functions ``module`` launches (``name[grid](...)``)."""
    source = inspect.getsource(module)
    return {(obj.fn.__module__, name) for name, obj in vars(module).items()
            if _is_jitted(obj) and re.search(rf"\b{re.escape(name)}\[", source)}


def test_every_launched_kernel_is_declared():
    """Every kernel launched from the core's kernels / toolkit and the per-step plugins is in PER_BATCH."""
    import pkgutil
    import warnings

    import nanocore.kernels
    import nanocore.toolkit
    names = [f"{package.__name__}.{info.name}" for package in (nanocore.kernels, nanocore.toolkit)
             for info in pkgutil.iter_modules(package.__path__)]
    launched = set()
    for name in names + ["nanocore_awq.kernels"]:
        with warnings.catch_warnings():  # deprecated aliases import fine
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                launched |= _launched(importlib.import_module(name))
            except ImportError:  # a plugin that is not installed
                continue
    assert ("nanocore.kernels.paged_attention_kernel", "paged_attention_kernel") in launched  # the scan works
    assert launched <= set(PER_BATCH), f"declare {sorted(launched - set(PER_BATCH))} in PER_BATCH"
