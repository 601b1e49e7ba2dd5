#!/usr/bin/env bash
# The GPU checks and benchmarks behind docs/benchmarks.md, grouped by topic; each step is time-boxed and a failure
# does not stop the rest. From the repository root on a GPU machine:
#   bash benchmarks/gpu_suite.sh OUTDIR [SECTION ...]          (default: tests throughput latency)
# Sections: tests throughput latency prefill codecs quant prefix moe interference serve attention profile compile
#   greedy, and on 2 GPUs tp2. JSON files land in OUTDIR; NANOCORE_GIT_COMMIT=<hash> names the commit where the
#   tree has no usable .git. A machine without network access installs carried wheels first (gpu_setup.sh).
out=${1:?usage: gpu_suite.sh OUTDIR [SECTION ...]}; shift
sections=${*:-tests throughput latency}
mkdir -p "$out"
if [ -d .whl ]; then source benchmarks/gpu_setup.sh || exit 1; fi
N="python3 -m nanocore.cli.main"
Q06="--model dummy:Qwen3-0.6B --device cuda --dtype bfloat16"
Q7="--model dummy:Qwen2.5-7B --device cuda --dtype bfloat16"
L8="--model dummy:Llama-3.1-8B --device cuda --dtype bfloat16"
MOE="--model dummy:Qwen1.5-MoE-A2.7B --device cuda --dtype bfloat16"
CODECS="unquantized int8 fp8_e4m3 k_int8_v_fp8"
WEIGHT_ONLY="unquantized fp8_w8a16 int8_w8a16 awq"
step() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" 2>&1 | tail -"${TAIL:-6}"; }

for s in $sections; do case $s in
tests)  # the cuda-marked tests of the engine, the kernels and every in-tree backend's conformance
  TAIL=12 step 300 python3 -m pytest -q -m cuda -rf --tb=short -p no:cacheprovider tests/ conformance/tests \
    plugins/ plugins_cache plugins_moe plugins_quant ;;
throughput)  # Nano-vLLM workload (bf16 and k_int8_v_fp8), then the many-short and fewer-long workloads
  for c in unquantized k_int8_v_fp8; do
    step 120 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $c --json "$out/nano_vllm_qwen3_0.6b_$c.json"
  done
  step 120 $N bench throughput $Q06 --num-seqs 512 --min-len 128 --max-len 512 --max-num-seqs 512 \
    --max-model-len 2048 --json "$out/many_short_qwen3_0.6b.json"
  step 120 $N bench throughput $Q06 --num-seqs 128 --min-len 512 --max-len 2048 --min-output-len 256 \
    --max-output-len 1024 --max-model-len 4096 --json "$out/fewer_long_qwen3_0.6b.json" ;;
latency)  # batch-1 decode: Qwen3-0.6B (bf16, k_int8_v_fp8) and Qwen2.5-7B per weight-only method
  for c in unquantized k_int8_v_fp8; do
    step 90 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 2048 --kv-codec $c \
      --json "$out/qwen3_0.6b_${c}_128.json"
    step 90 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 16640 --prompt-len 16384 --kv-codec $c \
      --json "$out/qwen3_0.6b_${c}_16k.json"
  done
  for m in $WEIGHT_ONLY; do
    step 90 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 --linear-method $m \
      --json "$out/qwen2.5_7b_$m.json"
  done ;;
prefill)  # 8 x 4,096 tokens at 0.6B per KV codec, 4 x 4,096 at 7B per W8A8 method (eager: prefill is not captured)
  for c in $CODECS; do
    step 90 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --enforce-eager --kv-codec $c \
      --json "$out/qwen3_0.6b_$c.json"
  done
  for m in unquantized int8_w8a8 fp8_w8a8 cutlass; do
    step 150 $N bench prefill $Q7 --num-seqs 4 --prompt-len 4096 --max-model-len 4608 --enforce-eager \
      --linear-method $m --json "$out/qwen2.5_7b_$m.json"
  done ;;
codecs)  # the KV-bound workload (Llama-3.1-8B shapes, bf16 cache preempts) per codec
  for c in $CODECS; do
    step 150 $N bench throughput $L8 --workload kv-bound --kv-codec $c --warmup one \
      --json "$out/kv_bound_llama3.1_8b_$c.json"
  done ;;
quant)  # one Qwen2.5-7B layer per method and M, then batch-8 / batch-32 decode per weight-only method
  TAIL=20 step 150 $N bench linear --device cuda --methods unquantized,fp8_w8a16,int8_w8a16,awq --ms 1,16,32 \
    --json "$out/bench_linear.json"
  TAIL=20 step 150 $N bench linear --device cuda --methods unquantized,int8_w8a8,fp8_w8a8 --ms 256,1024,4096 \
    --json "$out/bench_linear_w8a8.json"
  for b in 8 32; do for m in $WEIGHT_ONLY; do
    step 90 $N bench throughput $Q7 --num-seqs $b --max-num-seqs $b --min-len 128 --max-len 128 --min-output-len 256 \
      --max-output-len 256 --max-model-len 1024 --linear-method $m --json "$out/batch${b}_qwen2.5_7b_$m.json"
  done; done ;;
prefix)  # shared prefix against no reuse, hash prefix cache
  for m in "$Q06" "$Q7"; do
    tag=$(echo "$m" | sed 's/.*dummy:\([^ ]*\).*/\1/' | tr 'A-Z' 'a-z')
    TAIL=8 step 90 $N bench prefix $m --num-kv-blocks 8192 --prefix-cache hash --scenario no-reuse,shared-prefix \
      --repeats 2 --json "$out/prefix_hash_$tag.json"
  done ;;
moe)  # the kernels (tuned quickly first), batch-1 decode eager / fused with and without the shared-expert stream
  TAIL=10 step 200 $N tune moe --model dummy:Qwen1.5-MoE-A2.7B --quick
  TAIL=30 step 150 $N bench moe --output "$out/bench_moe.json"
  step 120 $N bench latency $MOE --max-num-seqs 8 --max-model-len 1024 --moe-executor eager --enforce-eager \
    --repeats 1 --json "$out/latency_qwen1.5_moe_eager.json"
  step 90 $N bench latency $MOE --max-num-seqs 8 --max-model-len 1024 --moe-executor triton_fused_moe \
    --json "$out/latency_qwen1.5_moe_fused.json"
  step 90 $N bench latency $MOE --max-num-seqs 8 --max-model-len 1024 --moe-executor triton_fused_moe \
    --no-moe-shared-expert-overlap --json "$out/latency_qwen1.5_moe_fused_no_overlap.json"
  step 180 $N bench throughput $MOE --max-model-len 2048 --min-len 128 --max-len 1024 --moe-executor triton_fused_moe \
    --json "$out/throughput_qwen1.5_moe_fused.json" ;;
interference)  # a 32K prompt arriving during a running decode, per scheduler policy and chunk size
  TAIL=10 step 150 $N bench interference $Q7 --b-prompt-len 32768 --json "$out/interference_qwen2.5_7b_32k.json" ;;
serve)  # served vs offline output tok/s at concurrency 256; TTFT / TPOT / ITL at 4, 16, 64 req/s
  TAIL=24 step 260 $N bench serve $Q06 --max-model-len 2048 --concurrency 256 --compare-offline \
    --json "$out/concurrency256_qwen3_0.6b.json"
  TAIL=16 step 150 $N bench serve $Q06 --max-model-len 2048 --request-rate 4,16,64 --num-prompts 48 --warmup one \
    --json "$out/rates_qwen3_0.6b.json" ;;
attention)  # the attention kernels alone: copy bandwidth, prefill against varlen_attn, decode per KV layout
  TAIL=30 step 200 python3 -m benchmarks.attention_micro --json "$out/attention_micro.json" ;;
profile)  # where a decode step's time goes: host phases, graph replay, the costliest kernels
  TAIL=40 step 200 python3 -m benchmarks.step_profile --model dummy:Qwen3-0.6B --device cuda --dtype bfloat16 \
    --batch-sizes 1 64 256 --context-len 512 --kernel-table 16 --timeline --json "$out/step_profile_0.6b.json" ;;
compile)  # no Triton compilation once the engine is ready
  TAIL=12 step 300 python3 -m benchmarks.compile_check --json "$out/compile_check.json" ;;
greedy)  # SmolLM2 greedy on the GPU against the CPU reference (needs the default model)
  for dtype in float32 bfloat16; do
    TAIL=12 step 150 python3 -m benchmarks.greedy_match --device cuda --dtype $dtype \
      --reference docs/data/correctness/greedy_smollm2_cpu.json --json "$out/greedy_smollm2_cuda_$dtype.json"
  done ;;
tp2)  # 2 GPUs: a TP=2 engine stage by stage, then TP / EP logits against one rank and the scaling bench
  TAIL=25 step 120 python3 -m benchmarks.tp_smoke --gpus 2
  TAIL=20 step 260 python3 -m benchmarks.tp_check --gpus 2 --backends --json "$out/tp_check_2gpu.json"
  TAIL=20 step 560 python3 -m benchmarks.tp_check --gpus 2 --skip-logits --bench --bench-model dummy:Qwen2.5-7B \
    --throughput-args "--num-seqs 128" --moe-bench-model dummy:Qwen1.5-MoE-A2.7B --moe-layouts "2,1 1,2 2,2" \
    --moe-modes throughput --moe-bench-args "--moe-executor triton_fused_moe --max-model-len 2048 --min-len 128" \
    --bench-timeout-s 150 --json "$out/tp_check_2gpu_bench.json" ;;
*) echo "unknown section $s (see the header of $0)"; exit 2 ;;
esac; done
