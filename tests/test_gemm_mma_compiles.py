"""The mixed-input tensor-core GEMMs (toolkit.gemm_mma, toolkit.gemm_int4) compile for Hopper (sm_90) and Ampere
(sm_80) without a GPU (Triton's ahead-of-time compile, ptxas included) for every tile config the shipped plans
pick, with bf16 and fp16 activations: into tensor-core instructions (wgmma on sm_90, mma.sync on sm_80) and
without register spills, so a config that only works in the interpreter fails here, not first on the GPU."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from nanocore.toolkit.gemm_config import MMA_TILES, weight_only_config  # noqa: E402
from nanocore.toolkit.gemm_int4 import _awq_mma_kernel  # noqa: E402
from nanocore.toolkit.gemm_mma import W_INT8_MAGIC, _mma_channel_kernel  # noqa: E402
from nanocore.toolkit.kernel_plan import KERNEL_PLANS, switch_points  # noqa: E402
from nanocore.toolkit.splitk import W_FP8, W_FP8_BITS, W_INT8  # noqa: E402

#: Weight encodings per format and GPU: (W_KIND, pointee); fp8 is native from sm_89 (``converts_fp8``), int8 is
#: read as bytes for the exponent trick (``fast_widen``) or as int8 for the conversion.
ENCODINGS = {"int8_channel": {80: [(W_INT8_MAGIC, "u8"), (W_INT8, "i8")], 90: [(W_INT8_MAGIC, "u8"), (W_INT8, "i8")]},
             "fp8_channel": {80: [(W_FP8_BITS, "u8")], 90: [(W_FP8, "fp8e4nv")]},
             "int4_group": {80: [(None, "i32")], 90: [(None, "i32")]}}
#: The AWQ group size compiled (the common one); the kernel's K tile is cut to it.
AWQ_GROUP = 128
#: The tensor-core instruction each target must use.
TENSOR_CORE_OP = {80: "mma.sync.aligned", 90: "wgmma.mma_async"}
#: Shared memory one block may take (A100: 163 KiB, H100: 227 KiB); past it the launch fails on the GPU only.
MAX_SHARED = {80: 166912, 90: 232448}
#: (swap_ab, activation dtype, EVEN_K) of the i-th case of a format: each pair of swap_ab and dtype within four.
VARIANTS = [(True, "bf16", True), (False, "fp16", False), (False, "bf16", True), (True, "fp16", False)]


def plan_tiles(fmt: str) -> list:
    """Every distinct mma config the shipped plan of ``fmt`` picks, from each side of every bound of its plan and of
    its MMA_TILES rows (the tiles change only there)."""
    bounds = set(switch_points(KERNEL_PLANS[fmt])) | {row[0] for row in MMA_TILES[fmt] if row[0] is not None}
    configs = {weight_only_config(m, 4096, 4096, fmt) for t in bounds for m in (t, t + 1)}
    return sorted((c for c in configs if c.kind == "mma"), key=lambda c: (c.block_m, c.block_n, c.block_k))


def kernel_source(fmt: str, cfg, w_kind, w_type: str, dtype: str, even_k: bool = True):
    """The jitted kernel, its signature, constexprs and the 16-divisibility hints the launcher's specialization gives
    checkpoint shapes (pointers, N, K and strides; M is not specialized)."""
    tiles = dict(SWAP_AB=cfg.swap_ab, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, HAS_BIAS=True)
    if fmt == "int4_group":
        fn, consts = _awq_mma_kernel, dict(tiles, GROUP_SIZE=AWQ_GROUP, BLOCK_K=min(cfg.block_k, AWQ_GROUP))
        pointers = {"x_ptr": dtype, "qw_ptr": "i32", "qz_ptr": "i32", "s_ptr": dtype, "b_ptr": dtype, "y_ptr": dtype}
    else:
        fn, consts = _mma_channel_kernel, dict(tiles, W_KIND=w_kind, BLOCK_K=cfg.block_k, EVEN_K=even_k)
        pointers = {"x_ptr": dtype, "w_ptr": w_type, "s_ptr": "fp32", "b_ptr": dtype, "y_ptr": dtype}
    names = list(fn.arg_names)
    sig = {n: f"*{pointers[n]}" if n in pointers else "constexpr" if n in consts else "i32" for n in names}
    attrs = {(i, ): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] != "constexpr" and n != "M"}
    return fn, sig, {(names.index(n), ): v for n, v in consts.items()}, attrs


def compile_case(capability: int, fmt: str, cfg, w_kind, w_type: str, dtype: str, even_k: bool = True) -> dict:
    """Compile one kernel for ``sm_<capability>``: registers and spilled bytes (ptxas -v), shared memory, the
    tensor-core instructions, and whether every wgmma reads its first operand from registers."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn, sig, consts, attrs = kernel_source(fmt, cfg, w_kind, w_type, dtype, even_k)
    triton.knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # where the ptxas -v log is printed
        kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", capability, 32),
                                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    usage = re.search(r"Used (\d+) registers", log.getvalue())
    spills = [int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", log.getvalue())]
    ptx = kernel.asm["ptx"]
    wgmma = re.findall(r"wgmma\.mma_async[^;]*;", ptx)
    return {"regs": int(usage.group(1)) if usage else None, "spill_bytes": sum(spills) if spills else None,
            "shared": kernel.metadata.shared,
            "ops": sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync\.aligned[\w.]*)", ptx))),
            "a_in_registers": bool(wgmma) and all(re.search(r"\},\s*\{%r", op) for op in wgmma)}


def cases(capability: int, everything: bool = False) -> list:
    """(fmt, cfg, w_kind, w_type, dtype, even_k) for one GPU: every plan tile and weight encoding, each with one of
    ``VARIANTS`` in turn (or with every swap_ab x dtype, ``everything``)."""
    out = []
    for fmt in sorted(ENCODINGS):
        pairs = [(cfg, enc) for cfg in plan_tiles(fmt) for enc in ENCODINGS[fmt][capability]]
        for i, (cfg, (w_kind, w_type)) in enumerate(pairs):
            variants = [(s, d, True) for s in (True, False) for d in ("bf16", "fp16")] if everything else [
                VARIANTS[i % len(VARIANTS)]]
            out += [(fmt, dataclasses.replace(cfg, swap_ab=swap), w_kind, w_type, dtype, even_k)
                    for swap, dtype, even_k in variants]
    return out


def compile_cases(capability: int, everything: bool = False) -> str:
    """One JSON line per case (or "skip: ..." where this machine has no ptxas); run in a fresh process."""
    try:
        triton.knobs.nvidia.ptxas.path, triton.knobs.nvidia.ptxas_blackwell.path
    except RuntimeError as exc:
        return f"skip: no ptxas here: {exc}"
    lines = []
    for fmt, cfg, w_kind, w_type, dtype, even_k in cases(capability, everything):
        case = dict(fmt=fmt, tiles=[cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages],
                    swap_ab=cfg.swap_ab, w_kind=w_kind, dtype=dtype, even_k=even_k)
        lines.append(json.dumps(dict(case, **compile_case(capability, fmt, cfg, w_kind, w_type, dtype, even_k))))
    return "\n".join(lines)


def run_fresh(capability: int, everything: bool = False) -> list | str:
    """``compile_cases`` in a fresh process without TRITON_INTERPRET and with an empty cache (so ptxas runs): the
    interpreter this test session runs in leaves ``triton.language`` patched (see test_fp8_compiles.py)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TRITON_CACHE_DIR=cache, TRITON_DEFAULT_FP_FUSION="1")
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_gemm_mma_compiles as t; "
                f"print('@@'); print(t.compile_cases({capability}, {everything}))")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout.split("@@\n", 1)[-1].strip()
    return out if out.startswith("skip:") else [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("capability", [80, 90])
def test_mma_kernels_compile_to_tensor_cores_without_spills(capability):
    results = run_fresh(capability)
    if isinstance(results, str):
        pytest.skip(results[5:])
    assert {r["fmt"] for r in results} == set(ENCODINGS) and {r["swap_ab"] for r in results} == {True, False}
    assert {r["dtype"] for r in results} == {"bf16", "fp16"}
    for r in results:
        print(r)
        dtype = {"bf16": "bf16", "fp16": "f16"}[r["dtype"]]
        assert any(op.startswith(TENSOR_CORE_OP[capability]) and f".{dtype}.{dtype}" in op for op in r["ops"]), r
        assert r["regs"] is not None and r["spill_bytes"] == 0, r  # the ptxas log was read; nothing spilled
        assert r["shared"] <= MAX_SHARED[capability], r
        if capability == 90:  # swap_ab's point: the widened weights feed wgmma from registers, not shared memory
            assert r["a_in_registers"] == r["swap_ab"], r


if __name__ == "__main__":  # the full table: python tests/test_gemm_mma_compiles.py [80|90]
    for line in run_fresh(int(sys.argv[1]) if len(sys.argv) > 1 else 90, everything=True):
        print(line)
