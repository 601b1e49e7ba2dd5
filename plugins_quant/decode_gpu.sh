#!/usr/bin/env bash
# Decode GEMV work on the H200, one call per section, each step time-boxed (output and JSON under OUTDIR):
#   bash plugins_quant/decode_gpu.sh OUTDIR probe   (~150 s: HBM ceilings, M = 1 / 16 sweep, ncu of 4 kernels)
#   bash plugins_quant/decode_gpu.sh OUTDIR final   (bench linear M = 1,16,256 and the quant plugins' cuda tests)
out=${1:?usage: decode_gpu.sh OUTDIR SECTION}; section=$2
export PYTHONUNBUFFERED=1
dists=". ./conformance"
for d in plugins*/*/; do [ -f "$d/pyproject.toml" ] && dists="$dists ./$d"; done
python3 -m pip install -q --no-index --no-deps --no-build-isolation $(for d in $dists; do echo "-e $d"; done) \
  >/tmp/pip-install.log 2>&1 || tail -5 /tmp/pip-install.log
step() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" 2>&1 | tail -"${TAIL:-8}"; }
PY_BENCH='import argparse,sys; from nanocore.bench import linear as L; p=argparse.ArgumentParser(); L.add_arguments(p); sys.exit(L.run_from_args(p.parse_args(sys.argv[1:])))'
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --launch-skip 3 --launch-count 1"
case $section in
probe)
  step 40 python3 plugins_quant/decode_probe_gpu.py bandwidth "$out/bandwidth.json"
  TAIL=70 step 200 python3 plugins_quant/tune_linear_gpu.py "$out" --budget-s 165 --ms 1,16 --kernels fp8,int8_w8a16,awq
  for k in fp8_gemv:_gemv_kernel int8_gemv:_gemv_kernel fp8_splitk16:_wo_splitk awq_default:_awq_splitk; do
    echo "== ncu ${k%%:*}" >>"$out/ncu.txt"
    timeout 40 $NCU -k "regex:${k##*:}" python3 plugins_quant/decode_probe_gpu.py kernel "${k%%:*}" >>"$out/ncu.txt" 2>&1
    echo "ncu ${k%%:*} exit $?"
  done ;;
final)
  TAIL=20 step 150 python3 -c "$PY_BENCH" --device cuda --methods unquantized,fp8_w8a16,int8_w8a16,awq --ms 1,16,256 \
    --json "$out/bench_linear_decode.json"
  TAIL=15 step 190 python3 -m pytest -q -m cuda -rf -p no:cacheprovider tests/test_quant_gemm.py plugins_quant/fp8_w8a16 \
    plugins_quant/int8_w8a8 plugins_quant/awq ;;
esac
