#!/usr/bin/env bash
# The one GPU call for this plugin's figures: cuda tests (kernels in bf16/fp16/fp32, no host sync,
# CUDA-graph capture, the conformance suite on CUDA), then benchmarks/moe_gpu_check.py. Run from the repo root.
set -u
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
site=/tmp/site && mkdir -p $site/nanocore_triton_fused_moe-0.1.0.dist-info   # entry point without pip
printf 'Metadata-Version: 2.1\nName: nanocore-triton-fused-moe\nVersion: 0.1.0\n' > $site/nanocore_triton_fused_moe-0.1.0.dist-info/METADATA
printf '[nanocore]\ntriton_fused_moe = nanocore_triton_fused_moe.plugin\n' > $site/nanocore_triton_fused_moe-0.1.0.dist-info/entry_points.txt
export PYTHONPATH=$PWD:$PWD/conformance:$PWD/plugins_moe/triton_fused_moe:$site
export NANOCORE_CONFORMANCE_EXAMPLES=${NANOCORE_CONFORMANCE_EXAMPLES:-15}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${TEST_TIMEOUT:-75} python3 -m pytest -q -x -p no:cacheprovider plugins_moe/triton_fused_moe/tests/test_cuda.py \
  "plugins_moe/triton_fused_moe/tests/test_conformance.py::TestTritonFusedMoE" 2>&1 | tee $OUT/pytest.log | tail -15
timeout ${BENCH_TIMEOUT:-130} python3 benchmarks/moe_gpu_check.py ${BENCH_BUDGET:-110}
