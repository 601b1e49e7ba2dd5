#!/usr/bin/env bash
# Every GPU check and benchmark of the engine, grouped in sections, in one call on the H200 (each step
# time-boxed; a failure does not stop the rest). Usage from the repo root on the GPU machine:
#   NANOCORE_GIT_COMMIT=<hash> bash benchmarks/gpu_suite.sh OUTDIR [SECTION ...]   (default: every section)
# (pass the dev checkout's `git rev-parse --short HEAD` literally: the device's copy of .git can be stale, and the
#  JSONs record this commit)
# Sections: tests engine profile codecs prefix moe interference attention (default), and
#   tune (kernel variant sweeps) quant (quantized linears: microbench + 7B end to end) final smollm2 (see there)
#   leftovers (7B prefix identity, fp8 / overlap cuda tests, int8 tiles), verify (all cuda tests but cutlass, 7B decode
#   per linear method), serve (bench serve vs offline, request rates), serveprof (the same under py-spy), contract
#   (cuda conformance), codecgap, on a 2-GPU machine tp2smoke tp2 tp2bench, and every session's own calls by name
#   (verify6 ... s13d: benchmarks/gpu_suite_sessions.sh)
out=${1:?usage: gpu_suite.sh OUTDIR [SECTION ...]}; shift
sections=${*:-tests engine profile codecs prefix moe interference attention}
source benchmarks/gpu_setup.sh || exit 1
source benchmarks/gpu_suite_sessions.sh  # the per-session sections (session_section)
N="python3 -m nanocore.cli.main"
Q06="--model dummy:Qwen3-0.6B --device cuda --dtype bfloat16"
Q7="--model dummy:Qwen2.5-7B --device cuda --dtype bfloat16"
MOE="--model dummy:Qwen1.5-MoE-A2.7B --device cuda --dtype bfloat16"
step() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" 2>&1 | tail -"${TAIL:-6}"; }
# 7B batch-1 latency per linear method into $o (JSON + log each, tarred by the section's pack): lat7 LIMIT_S METHOD...
# Qwen3-0.6B batch-1 `bench latency` (verbose log) into $o, JSON + log, then its exit and result line:
# lat06 LIMIT_S TAG [bench latency options]
lat06() { local t=$1 tag=$2; shift 2
  timeout "$t" $N -v bench latency $Q06 --max-num-seqs 8 "$@" --json $o/latency_$tag.json >$o/latency_$tag.log 2>&1
  echo "latency $tag exit $?"; tail -2 $o/latency_$tag.log | cut -c1-160; }
lat7() { local t=$1 m; shift; for m in "$@"; do
  timeout "$t" $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --linear-method $m \
    --json $o/latency_qwen2.5_7b_$m.json >$o/latency_$m.log 2>&1; echo "latency $m exit $?"; tail -2 $o/latency_$m.log
  pack; done; }

for s in $sections; do case $s in
tests)
  TAIL=12 step 150 python3 -m pytest -q -m cuda tests/test_kernels_small_ops.py tests/test_kernels_sampling.py \
    tests/test_gpu_engine.py tests/test_moe_shared_overlap.py plugins/decode_first ;;
tune)  # the new cuda tests, one throughput run, kernel variant sweeps (one call: at most ~590 s)
  TAIL=14 step 90 python3 -m pytest -q -m cuda tests/test_kernels_small_ops.py tests/test_kernels_sampling.py \
    tests/test_engine_async.py
  step 90 $N bench throughput $Q06 --max-model-len 2048 --json "$out/throughput_qwen3_0.6b_unquantized.json"
  TAIL=40 step 120 python3 plugins_quant/tune_linear_gpu.py "$out" --budget-s 100
  TAIL=40 step 120 python3 benchmarks/attention_quant_tune.py "$out" --budget-s 100
  TAIL=30 step 200 python3 benchmarks/cutlass_gpu_check.py "$out" ;;
quant)  # quantized linears: microbench (launched and graph-replayed) and Qwen2.5-7B end to end (about 480 s)
  TAIL=10 step 90 python3 -m pytest -q -m cuda tests/test_quant_gemm.py plugins_quant/fp8_w8a16/tests/test_kernels.py \
    plugins_quant/awq/tests/test_kernels.py tests/test_moe_shared_overlap.py
  TAIL=40 step 120 $N bench linear --device cuda --json "$out/bench_linear.json"
  for m in unquantized fp8_w8a16 awq; do
    step 50 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --linear-method $m --json "$out/latency_qwen2.5_7b_$m.json"
  done
  for m in unquantized cutlass; do
    step 150 $N bench prefill $Q7 --num-seqs 4 --prompt-len 4096 --max-model-len 4608 --enforce-eager --linear-method $m \
      --json "$out/prefill_qwen2.5_7b_$m.json"
  done
  TAIL=6 step 60 python3 -m pytest -q -m cuda plugins_quant/cutlass ;;
final)  # the last checks after the sweeps (one call, about 480 s; JSON straight into OUTDIR)
  TAIL=20 step 60 python3 -m pytest -q -m cuda --tb=line -rf tests/test_quant_gemm.py
  TAIL=14 step 60 $N bench linear --device cuda --methods unquantized,fp8_w8a16,int8_w8a16 --ms 1,16,256 \
    --json "$out/bench_linear_fp8.json"
  step 50 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --linear-method fp8_w8a16 \
    --json "$out/latency_qwen2.5_7b_fp8_w8a16.json"
  step 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec k_int8_v_fp8 --json "$out/throughput_qwen3_0.6b_k_int8_v_fp8.json"
  for codec in unquantized k_int8_v_fp8; do
    step 30 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --kv-codec $codec \
      --json "$out/latency_qwen3_0.6b_$codec.json"
  done
  for overlap in moe-shared-expert-overlap no-moe-shared-expert-overlap; do
    step 50 $N bench latency $MOE --max-num-seqs 8 --max-model-len 1024 --moe-executor triton_fused_moe --$overlap \
      --json "$out/latency_qwen1.5_moe_fused_$overlap.json"
  done
  TAIL=20 step 130 python3 -m pytest -q -m cuda --tb=line -rf plugins_quant/cutlass ;;
smollm2)  # SmolLM2 greedy on the GPU vs the CPU reference (docs/data/greedy_smollm2_cpu.json); needs the GGUF, which
  # is larger than one call may carry: on the dev machine `mkdir -p .smollm2 && split -n 2 <the GGUF> .smollm2/part_`
  # (pip download --no-deps gguf -d .whl), then two back-to-back calls (a warm machine keeps /tmp):
  #   call 1, carry [".whl", ".smollm2/part_aa"]: mkdir -p /tmp/smol && cp .smollm2/part_aa /tmp/smol/
  #   call 2, carry [".whl", ".smollm2/part_ab"]: cat /tmp/smol/part_aa .smollm2/part_ab > /tmp/smol/s.gguf &&
  #     NANOCORE_DEFAULT_GGUF=/tmp/smol/s.gguf bash benchmarks/gpu_suite.sh $OUT smollm2
  for dtype in float32 bfloat16; do
    TAIL=12 step 150 python3 -m benchmarks.greedy_match --device cuda --dtype $dtype \
      --reference docs/data/greedy_smollm2_cpu.json --json "$out/greedy_smollm2_cuda_$dtype.json"
  done ;;
engine)
  step 90 $N bench throughput $Q06 --max-model-len 2048 --json "$out/throughput_qwen3_0.6b_unquantized.json"
  step 90 $N bench throughput $Q06 --max-model-len 2048 --no-async-scheduling --json "$out/throughput_qwen3_0.6b_sync.json"
  step 30 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --json "$out/latency_qwen3_0.6b_unquantized.json"
  step 50 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --json "$out/latency_qwen2.5_7b.json"
  step 30 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --enforce-eager \
    --json "$out/prefill_qwen3_0.6b.json" ;;
profile)
  TAIL=20 step 60 python3 -m benchmarks.step_profile --model dummy:Qwen3-0.6B --device cuda --dtype bfloat16 \
    --batch-sizes 1 64 256 --context-len 512 --json "$out/step_profile_0.6b.json" ;;
codecs)
  TAIL=30 step 150 python3 benchmarks/attention_quant_tune.py "$out" --budget-s 120
  step 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec k_int8_v_fp8 --json "$out/throughput_qwen3_0.6b_k_int8_v_fp8.json"
  step 30 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --kv-codec k_int8_v_fp8 \
    --json "$out/latency_qwen3_0.6b_k_int8_v_fp8.json" ;;
prefix)
  for m in "$Q06" "$Q7"; do
    tag=$(echo "$m" | sed 's/.*dummy:\([^ ]*\).*/\1/')
    TAIL=8 step 60 $N bench prefix $m --num-kv-blocks 8192 --prefix-cache hash --scenario no-reuse,shared-prefix \
      --repeats 2 --json "$out/prefix_hash_$tag.json"
  done ;;
moe)
  step 90 $N bench latency $MOE --max-num-seqs 8 --max-model-len 1024 --moe-executor eager --enforce-eager \
    --repeats 1 --json "$out/latency_qwen1.5_moe_eager.json"
  step 60 $N bench latency $MOE --max-num-seqs 8 --max-model-len 1024 --moe-executor triton_fused_moe \
    --json "$out/latency_qwen1.5_moe_fused.json"
  step 180 $N bench throughput $MOE --max-model-len 2048 --min-len 128 --max-len 1024 --moe-executor triton_fused_moe \
    --json "$out/throughput_qwen1.5_moe_fused.json" ;;
interference)
  TAIL=10 step 70 $N bench interference $Q7 --b-prompt-len 32768 --json "$out/interference.json" --plot "$out/interference.png" ;;
tp2smoke)  # a TP=2 engine stage by stage (eager, graphs, MoE TP=2+EP=2); a stuck one dumps every rank's stack
  for flags in "--eager" "" "--moe --eager"; do
    log="$out/tp_smoke$(echo $flags | tr -d ' -').log"; echo "== tp_smoke $flags (full log: $log)"
    NANOCORE_TRACE_WORKERS=1 NANOCORE_DIST_TIMEOUT_S=60 NCCL_DEBUG=WARN setsid python3 -m benchmarks.tp_smoke \
      --gpus 2 $flags >"$log" 2>&1 & pid=$!  # its own process group: the watchdog reaches its ranks and nothing else
    ( sleep 75; kill -USR1 -- -$pid; sleep 3; kill -9 -- -$pid ) 2>/dev/null & dog=$!
    wait $pid; echo "exit $?"; kill $dog 2>/dev/null
    grep -v "Warning\|warn(\|call execute" "$log" | tail -${TAIL:-25}
  done ;;
tp2)  # TP=2 / EP=2 / TP=2+EP=2 logits vs one GPU and plugins chosen by name in the workers (~180 s; full log kept)
  echo "== tp_check --gpus 2 --backends (log: $out/tp_check_2gpu.log)"
  NANOCORE_TRACE_WORKERS=1 NANOCORE_DIST_TIMEOUT_S=60 timeout -k 10 260 python3 -m benchmarks.tp_check --gpus 2 \
    --backends --json "$out/tp_check_2gpu.json" >"$out/tp_check_2gpu.log" 2>&1; echo "exit $?"
  grep -E "TP=|Error|error" "$out/tp_check_2gpu.log" | grep -v "call execute" | tail -20 ;;
tp2bench)  # Qwen2.5-7B TP=1 vs TP=2 (throughput, latency); Qwen1.5-MoE TP=2 vs EP=2 vs TP=2+EP=2 throughput
  TAIL=20 step 560 python3 -m benchmarks.tp_check --gpus 2 --skip-logits --bench --bench-model dummy:Qwen2.5-7B \
    --throughput-args "--num-seqs 128" --moe-bench-model dummy:Qwen1.5-MoE-A2.7B --moe-layouts "2,1 1,2 2,2" \
    --moe-modes throughput --moe-bench-args "--moe-executor triton_fused_moe --max-model-len 2048 --min-len 128" \
    --bench-timeout-s 150 --json "$out/tp_check_2gpu_bench.json" ;;
leftovers)  # 7B prefix identity with the near-tie report, fp8 / shared-overlap cuda tests, int8 x int8 tiles
  TAIL=30 step 60 $N bench prefix $Q7 --num-kv-blocks 8192 --prefix-cache hash --scenario shared-prefix --repeats 2 \
    --json "$out/prefix_hash_qwen2.5_7b.json"
  TAIL=20 step 120 python3 -m pytest -q -m cuda --tb=short -rf plugins_quant/fp8_w8a16/tests/test_kernels.py \
    tests/test_moe_shared_overlap.py
  TAIL=14 step 60 $N bench linear --device cuda --methods unquantized,int8_w8a8 --ms 256,1024,4096 \
    --json "$out/bench_linear_int8_tiles.json"
  python3 -c "from pathlib import Path; from benchmarks.tp_check import make_checkpoints as m; m(Path('/tmp/qc'), False)" \
    >/dev/null 2>&1
  for m in fp8_w8a16 int8_w8a8 awq; do  # nanocore quantize --device cuda (no calibration text: no tokenizer here)
    step 60 $N quantize --method $m --model /tmp/qc/dense --out /tmp/qc/$m --device cuda
  done ;;
verify)  # every plugin's cuda conformance and the engine's cuda tests, attention, 7B decode per method (~500 s)
  TAIL=25 step 220 python3 -m pytest -q -m cuda -rf --tb=short -p no:cacheprovider tests/test_gpu_engine.py \
    tests/test_engine_async.py tests/test_kernels_small_ops.py tests/test_kernels_kv_store.py tests/test_moe_shared_overlap.py \
    plugins/ conformance/tests plugins_cache plugins_moe plugins_quant/fp8_w8a16/tests/test_conformance.py \
    plugins_quant/int8_w8a8 plugins_quant/awq/tests/test_conformance.py
  TAIL=8 step 150 python3 -m pytest -q -m cuda -rf --tb=short -p no:cacheprovider tests/test_kernels_attention.py tests/test_kernels_attention_cuda.py
  for m in unquantized fp8_w8a16 awq; do
    step 55 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --linear-method $m --json "$out/latency_qwen2.5_7b_$m.json"
  done ;;
serve)  # served vs offline output tok/s at concurrency 256 (one server, one call); TTFT/TPOT/ITL at 4, 16, 64 req/s
  TAIL=24 step 260 $N bench serve $Q06 --max-model-len 2048 --concurrency 256 --compare-offline \
    --json "$out/serve_c256_qwen3_0.6b.json"
  TAIL=16 step 150 $N bench serve $Q06 --max-model-len 2048 --request-rate 4,16,64 --num-prompts 48 --warmup one \
    --json "$out/serve_rates_qwen3_0.6b.json" ;;
serveprof)  # concurrency 256 vs offline with a GIL profile of server and clients (py-spy raw stacks, ~300 s)
  TAIL=24 step 320 /tmp/site/bin/py-spy record --gil --subprocesses -r 50 -f raw -o "$out/serve_c256.gil.txt" -- \
    $N bench serve $Q06 --max-model-len 2048 --concurrency 256 --compare-offline --json "$out/serve_c256_prof.json" ;;
contract)  # the conformance suite's cuda checks on every in-tree backend after the contract 1.1 changes (~200 s)
  TAIL=25 step 190 python3 -m pytest -q -m cuda -rf --tb=line -p no:cacheprovider conformance/tests plugins/ \
    plugins_cache plugins_moe plugins_quant/fp8_w8a16/tests/test_conformance.py plugins_quant/int8_w8a8/tests \
    plugins_quant/awq/tests/test_conformance.py ;;
codecgap)  # where k_int8_v_fp8's throughput loss comes from: decode steps and kernels at two contexts, prefill (~300 s)
  for c in unquantized k_int8_v_fp8; do
    TAIL=30 step 100 python3 -m benchmarks.step_profile --model dummy:Qwen3-0.6B --batch-sizes 256 --context-len 256 1024 \
      --kv-codec $c --kernel-table 10 --json "$out/step_profile_0.6b_$c.json"
    step 40 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --enforce-eager --kv-codec $c \
      --json "$out/prefill_qwen3_0.6b_$c.json"
  done ;;
attention)  # the attention kernels' own cuda tests (about 100 compiles)
  TAIL=8 step 120 python3 -m pytest -q -m cuda tests/test_kernels_attention.py tests/test_kernels_attention_cuda.py -x ;;
*) session_section "$s" ;;
esac; done
