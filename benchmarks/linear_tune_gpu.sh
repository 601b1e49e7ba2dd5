#!/usr/bin/env bash
# One GPU call for the weight-only mixed-input GEMMs: their cuda tests, `nanocore tune linear` (every kernel per M),
# the fastest written into the source tables (benchmarks/apply_linear_tune.py), then `nanocore bench linear` on a
# Llama-3.1-8B layer with them; JSON and the two edited tables under $OUT. Run from the repo root of a checkout.
set -o pipefail
export PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh || exit 1  # carried wheels and every in-tree distribution
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout "${TEST_S:-120}" python3 -m pytest -q -m cuda tests/test_gemm_mma.py tests/test_quant_gemm.py \
  plugins_quant/awq/tests/test_kernels.py plugins_quant/fp8_w8a16/tests/test_kernels.py 2>&1 | tee "${OUT:?set OUT to a results folder}/pytest.log" | tail -6
timeout "${TUNE_S:-170}" nanocore tune linear --ms "${TUNE_MS:-32,64,256,1024,4096}" --json "${OUT:?set OUT to a results folder}/tune_linear.json" 2>&1 \
  | tee "${OUT:?set OUT to a results folder}/tune.log" | tail -20
[ -f "${OUT:?set OUT to a results folder}/tune_linear.json" ] && python3 benchmarks/apply_linear_tune.py "$OUT/tune_linear.json" . | tee "$OUT/tables.txt"
timeout "${BENCH_S:-150}" nanocore bench linear --shapes llama-3.1-8b --methods unquantized,int8_w8a16,fp8_w8a16,awq \
  --ms 1,16,64,256,512,1024,4096 --json "${OUT:?set OUT to a results folder}/bench_linear.json" 2>&1 | tee "$OUT/bench.log" | tail -30
