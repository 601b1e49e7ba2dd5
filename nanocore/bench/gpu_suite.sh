#!/usr/bin/env bash
# Every GPU check and benchmark of the engine in one run on the H200 (each step time-boxed; a failure
# does not stop the rest). Usage from the repo root on the GPU machine:  bash nanocore/bench/gpu_suite.sh OUTDIR
out=${1:?usage: gpu_suite.sh OUTDIR}
source nanocore/bench/gpu_setup.sh || exit 1
N="python3 -m nanocore.cli.main"
Q06="--model dummy:Qwen3-0.6B --device cuda --dtype bfloat16"
Q7="--model dummy:Qwen2.5-7B --device cuda --dtype bfloat16"
step() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" 2>&1 | tail -"${TAIL:-6}"; }

TAIL=12 step 80 python3 -m pytest -q -m cuda tests/test_kernels_small_ops.py tests/test_gpu_engine.py plugins/decode_first
TAIL=30 step 60 python3 nanocore/bench/attention_micro.py --quant-only --json "$out/attention_quant.json"
for codec in unquantized k_int8_v_fp8; do
  step 55 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $codec --json "$out/throughput_qwen3_0.6b_$codec.json"
  step 30 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --kv-codec $codec --json "$out/latency_qwen3_0.6b_$codec.json"
done
step 50 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --json "$out/latency_qwen2.5_7b.json"
step 30 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --enforce-eager --json "$out/prefill_qwen3_0.6b.json"
TAIL=8 step 50 $N bench prefix $Q06 --num-kv-blocks 8192 --prefix-cache hash --scenario no-reuse,shared-prefix \
  --repeats 2 --json "$out/prefix_hash_qwen3_0.6b.json"
TAIL=10 step 70 $N bench interference $Q7 --b-prompt-len 32768 --json "$out/interference.json" --plot "$out/interference.png"
# with time left: the attention kernels' own cuda tests (about 100 compiles)
TAIL=8 step 120 python3 -m pytest -q -m cuda tests/test_kernels_attention.py -x
