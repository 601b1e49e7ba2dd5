#!/usr/bin/env bash
# Per-session sections of benchmarks/gpu_suite.sh (sourced by it; not run alone): each session's device calls as run,
# kept so that the figures in docs/benchmarks*.md and docs/data/*/README.md can be reproduced by name. Globals from
# gpu_suite.sh: out, N, Q06, Q7, MOE, step, lat7. Sections: verify6 perf6 probe7 kvbound moefp8 sweep7 final7 last7
# graphs8 next17a next17b s8a s8b s8c s8d cudafull s9a s9b s9c s9d s9f s10a..s10f s11a..s11d s12a..s12f s13a..s13d, s14a..s14d, s15a..s15c, s16b, s16c, s17a, s17b, s17c, s17e, and s18a (queued).
# A name it does not know is reported ("unknown section") and skipped.
# ncu --set full of the decode kernel, the engine's choice (``attention_probe``): OUTDIR LAYOUT SEQS CTX HEADS KV_HEADS;
# keeps the details page as CSV, drops the report
ncu_decode_probe() {
  local o=$1; shift; local tag=$1_$2x$3_h$4
  timeout 45 ncu --clock-control none --set full -k regex:"paged_attention|narrow_decode" --launch-skip 4 \
    --launch-count 1 -o $o/ncu_$tag python3 -m benchmarks.attention_probe $1 --seqs $2 --ctx $3 --heads $4 \
    --kv-heads $5 >$o/ncu_$tag.log 2>&1
  echo "ncu $tag exit $?"; ncu -i $o/ncu_$tag.ncu-rep --page details --csv >$o/ncu_$tag.details.csv 2>&1
  rm -f $o/ncu_$tag.ncu-rep
}

# batch-1 TPOT with the one-tile split floor (as shipped) and without (batch_choice passing decode=False, edited in
# place for the run and restored), same call: floor_ab NAME "CODEC PROMPT_LEN MAX_MODEL_LEN" ...  (into $out/NAME.tgz)
floor_ab() {
  local o=/tmp/$1 f=nanocore/kernels/attention_config.py run rule; shift; mkdir -p $o
  grep -q 'decode=False)' $f && { echo "floor_ab: $f is already edited (a killed run?): restore it first"; return; }
  cp $f /tmp/attention_config.py.orig
  for run in "$@"; do
    set -- $run
    for rule in floor nofloor; do
      cp /tmp/attention_config.py.orig $f
      [ $rule = nofloor ] && sed -i 's/decode=max_query_len <= 1)/decode=False)/' $f
      lat06 75 $1_$2_$rule --max-model-len $3 --prompt-len $2 --kv-codec $1; echo "($(grep -c 'decode=False' $f) edits)"
      tar -czf "$out/$(basename $o).tgz" -C $o .
    done
  done
  cp /tmp/attention_config.py.orig $f
}

session_section() {
case $1 in
verify6)  # session 6's GPU paths first (~330 s): fresh-K/V prefill attention, kernel warm-up, fp8 MoE experts,
  # packed W8A16 / block fp8 on int8 + fp8 plugins, then the check that nothing compiles after the engine is ready
  TAIL=14 step 150 python3 -m pytest -q -m cuda -x -rf --tb=short tests/test_attention_fresh_kv.py tests/test_kernels_attention.py tests/test_kernels_attention_cuda.py
  TAIL=14 step 110 python3 -m pytest -q -m cuda -rf --tb=short tests/test_kernel_warmup_gpu.py tests/test_gpu_engine.py \
    tests/test_engine_async.py tests/test_kernels_small_ops.py tests/test_kernels_kv_store.py tests/test_moe_fp8_experts.py \
    plugins_moe tests/test_producer_checkpoints.py plugins_quant/int8_w8a8
  TAIL=24 step 120 python3 benchmarks/compile_check.py --json "$out/compile_check.json" ;;
perf6)  # session 6's figures (~300 s): prefill 8 x 4096 per codec (the chunk reads its own K/V unquantized), chunk
  # attention per codec, serve TTFT / TPOT at Poisson rates with the kernel warm-up
  for c in unquantized k_int8_v_fp8 int8 fp8_e4m3; do
    TAIL=3 step 45 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --enforce-eager --kv-codec $c \
      --json "$out/prefill_qwen3_0.6b_$c.json"
  done
  TAIL=30 step 60 python3 benchmarks/attention_chunk_codec.py "$out"
  TAIL=16 step 110 $N bench serve $Q06 --max-model-len 2048 --request-rate 4,16,64 --num-prompts 48 --warmup one \
    --json "$out/serve_rates_qwen3_0.6b.json" ;;
probe7)  # session 7: ncu of the decode attention kernels at 64 x 4K (bf16 vs the one-byte paths), timings at GQA 2 and 7
  for spec in "bf16" "int8 fold" "int8 fp16_vw" "fp8_e4m3 fp16_hwcvt" "k_int8_v_fp8 fold"; do
    tag=$(echo $spec | tr ' ' _); echo "== ncu $spec"
    timeout 90 ncu --clock-control none --set full -k regex:paged_attention_kernel --launch-skip 4 --launch-count 1 \
      -o "$out/ncu_$tag" python3 -m benchmarks.attention_probe $spec >"$out/ncu_$tag.log" 2>&1; tail -2 "$out/ncu_$tag.log"
    ncu -i "$out/ncu_$tag.ncu-rep" --page details --csv >"$out/ncu_$tag.details.csv" 2>&1
    ncu -i "$out/ncu_$tag.ncu-rep" --page source --csv --print-source sass >"$out/ncu_$tag.sass.csv" 2>&1
  done
  for heads in "16 8" "28 4"; do for spec in "bf16" "int8" "fp8_e4m3" "k_int8_v_fp8"; do for shape in "64 4096" "256 512"; do
    set -- $heads; h=$1; kvh=$2; set -- $shape
    timeout 60 python3 -m benchmarks.attention_probe $spec --time --heads $h --kv-heads $kvh --seqs $1 --ctx $2 2>&1 | tail -1
  done; done; done ;;
kvbound)  # issue 17's KV-bound workload per codec (Llama-3.1-8B shapes, 512 seqs; kernel warm-up at start, one short
  # untimed request: a full warm-up pass would double ~1 min per codec); CODECS overrides the list
  for c in ${CODECS:-unquantized k_int8_v_fp8 int8 fp8_e4m3}; do
    TAIL=8 step 240 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$out/throughput_kv_bound_llama3.1_8b_$c.json"
  done ;;
moefp8)  # the fp8 expert conformance check on cuda after its tolerance change (session 6)
  TAIL=8 step 120 python3 -m pytest -q -m cuda -rf --tb=short plugins_moe/triton_fused_moe/tests/test_conformance.py \
    tests/test_moe_fp8_experts.py ;;
sweep7)  # one-byte decode attention: quant paths x tiles x forced splits at GQA 2 and 4, compiled in parallel (~200 s)
  TAIL=40 step 400 python3 -m benchmarks.attention_decode_sweep "$out" ;;
final7)  # session 7's last call (~600 s; every result tarred into OUTDIR/final7.tgz after each step, as a call
  # returns at most 8 files): 1-warp decode sweep, throughput and KV-bound per codec, GQA 7 probes, attention tests
  o=/tmp/final7; mkdir -p $o; pack() { tar -czf "$out/final7.tgz" -C $o . ; }
  TAIL=40 step 150 python3 -m benchmarks.attention_decode_sweep $o --variants one_warp; pack
  for c in unquantized k_int8_v_fp8; do
    step 75 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $c --json "$o/throughput_qwen3_0.6b_$c.json"; pack
  done
  for c in unquantized k_int8_v_fp8; do
    TAIL=3 step 110 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$o/throughput_kv_bound_llama3.1_8b_$c.json"; pack
  done
  for spec in bf16 int8 fp8_e4m3 k_int8_v_fp8; do for shape in "64 4096" "256 512"; do set -- $shape
    timeout 40 python3 -m benchmarks.attention_probe $spec --time --heads 28 --kv-heads 4 --seqs $1 --ctx $2 2>&1 | tail -1
  done; done
  TAIL=8 step 100 python3 -m pytest -q -m cuda -rf --tb=short tests/test_attention_fresh_kv.py tests/test_kernels_attention.py tests/test_kernels_attention_cuda.py
  for c in int8 fp8_e4m3; do
    TAIL=3 step 110 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$o/throughput_kv_bound_llama3.1_8b_$c.json"; pack
  done ;;
last7)  # a short call: nano-vllm throughput, k_int8_v_fp8 then bf16, logs and JSON tarred after each (~150 s)
  o=/tmp/last7; mkdir -p $o
  for c in k_int8_v_fp8 unquantized; do
    timeout 95 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $c --json "$o/throughput_qwen3_0.6b_$c.json" \
      >"$o/throughput_$c.log" 2>&1; echo "exit $?"; tail -4 "$o/throughput_$c.log"; tar -czf "$out/last7.tgz" -C $o .
  done ;;
graphs8)  # next session: piecewise graphs for steps with prefill chunks (experimental flag) on the GPU: the cuda
  # equality test, then interference and throughput with and without (~450 s; interference builds 4 7B engines)
  TAIL=10 step 120 python3 -m pytest -q -m cuda -rf --tb=short tests/test_gpu_engine.py
  for f in no-cuda-graph-mixed cuda-graph-mixed; do
    TAIL=10 step 160 $N bench interference $Q7 --b-prompt-len 32768 --$f --json "$out/interference_$f.json"
    step 75 $N bench throughput $Q06 --max-model-len 2048 --$f --json "$out/throughput_qwen3_0.6b_$f.json"
  done ;;
next17a)  # next session, issue 17 with the 1-warp decode tile (~350 s; results in OUTDIR/next17a.tgz after each step, a
  # call returns at most 8 files): nano-vllm throughput pair, batch-1 TPOT at 128 and 16K context, the GQA 7 sweep rows
  o=/tmp/next17a; mkdir -p $o; pack() { tar -czf "$out/next17a.tgz" -C $o . ; }
  for c in unquantized k_int8_v_fp8; do
    step 80 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $c --json "$o/throughput_qwen3_0.6b_$c.json"; pack
    step 40 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --kv-codec $c --json "$o/latency_qwen3_0.6b_$c.json"
    step 60 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 16640 --prompt-len 16384 --kv-codec $c \
      --json "$o/latency_16k_qwen3_0.6b_$c.json"; pack
  done
  TAIL=30 step 150 python3 -m benchmarks.attention_decode_sweep $o --variants one_warp; pack ;;
next17b)  # next session: the KV-bound workload per codec with the 1-warp tile (~450 s)
  o=/tmp/next17b; mkdir -p $o; pack() { tar -czf "$out/next17b.tgz" -C $o . ; }
  for c in unquantized k_int8_v_fp8 int8 fp8_e4m3; do
    TAIL=3 step 110 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$o/throughput_kv_bound_llama3.1_8b_$c.json"; pack
  done ;;
s8a)  # session 8's first call (~560 s; results tarred into OUTDIR/s8a.tgz after each step): the engine's cuda tests
  # (piecewise graphs' equality test included), nano-vllm throughput bf16 / k_int8_v_fp8 (1-warp decode tile) /
  # bf16 with piecewise graphs, 7B interference with piecewise graphs
  o=/tmp/s8a; mkdir -p $o; pack() { tar -czf "$out/s8a.tgz" -C $o . ; }
  TAIL=14 step 130 python3 -m pytest -q -m cuda -rf --tb=short tests/test_gpu_engine.py >$o/gpu_engine_tests.log; pack
  cat $o/gpu_engine_tests.log
  for c in unquantized k_int8_v_fp8; do
    step 80 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $c --json "$o/throughput_qwen3_0.6b_$c.json"; pack
  done
  step 90 $N bench throughput $Q06 --max-model-len 2048 --cuda-graph-mixed \
    --json "$o/throughput_qwen3_0.6b_unquantized_cuda_graph_mixed.json"; pack
  TAIL=12 step 180 $N bench interference $Q7 --b-prompt-len 32768 --cuda-graph-mixed \
    --modes no_chunking,decode_first_chunk128,decode_first_chunk1024 --json "$o/interference_cuda_graph_mixed.json"; pack ;;
s8b)  # session 8's second call (~560 s, OUTDIR/s8b.tgz): 7B interference without piecewise graphs (same modes), batch-1
  # TPOT at 128 and 16K context per codec, KV-bound workload bf16 / k_int8_v_fp8 with the 1-warp tile
  o=/tmp/s8b; mkdir -p $o; pack() { tar -czf "$out/s8b.tgz" -C $o . ; }
  TAIL=12 step 150 $N bench interference $Q7 --b-prompt-len 32768 --no-cuda-graph-mixed \
    --modes no_chunking,decode_first_chunk128,decode_first_chunk1024 --json "$o/interference_eager_mixed.json"; pack
  for c in unquantized k_int8_v_fp8; do
    step 40 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --kv-codec $c --json "$o/latency_qwen3_0.6b_$c.json"
    step 60 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 16640 --prompt-len 16384 --kv-codec $c \
      --json "$o/latency_16k_qwen3_0.6b_$c.json"; pack
  done
  for c in unquantized k_int8_v_fp8; do
    TAIL=3 step 110 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$o/throughput_kv_bound_llama3.1_8b_$c.json"; pack
  done ;;
s8c)  # session 8's third call (~580 s, OUTDIR/s8c.tgz): cuda tests of the engine and of chunk attention with split-KV,
  # 7B interference (piecewise graphs now default, chunks split over long prefixes), throughput with / without
  # piecewise graphs, batch-1 TPOT per one-token tile on k_int8_v_fp8
  o=/tmp/s8c; mkdir -p $o; pack() { tar -czf "$out/s8c.tgz" -C $o . ; }
  step 170 python3 -m pytest -q -m cuda -rf --tb=short tests/test_gpu_engine.py tests/test_attention_fresh_kv.py \
    tests/test_kernels_attention_cuda.py >$o/cuda_tests.log 2>&1; tail -6 $o/cuda_tests.log; pack
  TAIL=12 step 150 $N bench interference $Q7 --b-prompt-len 32768 \
    --modes no_chunking,decode_first_chunk128,decode_first_chunk1024 --json "$o/interference_default.json"; pack
  step 80 $N bench throughput $Q06 --max-model-len 2048 --json "$o/throughput_qwen3_0.6b_unquantized.json"; pack
  step 80 $N bench throughput $Q06 --max-model-len 2048 --no-cuda-graph-mixed \
    --json "$o/throughput_qwen3_0.6b_unquantized_no_mixed.json"; pack
  step 40 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --json "$o/latency_qwen3_0.6b_unquantized.json"
  for tile in default 64/4/2 128/4/2; do
    NANOCORE_ATTN_DECODE_TILE=$([ $tile = default ] || echo $tile) step 40 $N bench latency $Q06 --max-num-seqs 8 \
      --max-model-len 1024 --kv-codec k_int8_v_fp8 --json "$o/latency_qwen3_0.6b_k_int8_v_fp8_${tile//\//_}.json"; pack
  done ;;
s8d)  # session 8's last call: a 128-token chunk's step time up to 32K context (A decodes through all of B's chunks),
  # then the KV-bound pair with the 1-warp tile (logs kept)
  o=/tmp/s8d; mkdir -p $o; pack() { tar -czf "$out/s8d.tgz" -C $o . ; }
  TAIL=6 step 100 $N bench interference $Q7 --b-prompt-len 32768 --a-output-len 300 --warmup 0 \
    --modes decode_first_chunk128 --json "$o/interference_chunk128_long.json"; pack
  for c in k_int8_v_fp8 unquantized; do
    timeout 200 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$o/throughput_kv_bound_llama3.1_8b_$c.json" >$o/kv_bound_$c.log 2>&1
    echo "exit $?"; tail -3 $o/kv_bound_$c.log; pack
  done ;;
cudafull)  # next session first: every attention / engine cuda test at the current commit, one step per file with a
  # limit that fits its compiles (session 8's runs were cut at 170 / 150 s), logs tarred into OUTDIR/cudafull.tgz
  o=/tmp/cudafull; mkdir -p $o; pack() { tar -czf "$out/cudafull.tgz" -C $o . ; }
  for f in tests/test_gpu_engine.py tests/test_attention_fresh_kv.py tests/test_kernels_attention_cuda.py \
      tests/test_kernels_attention.py tests/test_kernel_warmup_gpu.py; do
    timeout 240 python3 -m pytest -q -m cuda -rf --tb=short $f >"$o/$(basename $f .py).log" 2>&1
    echo "$f exit $?"; tail -2 "$o/$(basename $f .py).log"; pack
  done ;;
s9a)  # session 9 first call: the session-8 mends (piecewise views per step, launch-plan memo) on the GPU: engine,
  # fresh-K/V chunk and attention-kernel cuda tests, one step per file, logs tarred into OUTDIR/s9a.tgz (<= 560 s)
  o=/tmp/s9a; mkdir -p $o; pack() { tar -czf "$out/s9a.tgz" -C $o . ; }
  for spec in tests/test_gpu_engine.py:200 tests/test_attention_fresh_kv.py:130 tests/test_kernels_attention_cuda.py:210; do
    f=${spec%:*}; timeout ${spec#*:} python3 -m pytest -q -m cuda -rf --tb=short $f >"$o/$(basename $f .py).log" 2>&1
    echo "$f exit $?"; tail -2 "$o/$(basename $f .py).log"; pack
  done ;;
s9b)  # session 9, issue 16: the AWQ CUDA GEMV and the int8 byte-permute GEMV: cuda tests, plan sweep, bench linear,
  # 7B batch-1 latency bf16 / awq (<= 500 s; logs and JSON tarred into OUTDIR/s9b.tgz)
  o=/tmp/s9b; mkdir -p $o; pack() { tar -czf "$out/s9b.tgz" -C $o . ; }
  timeout 150 python3 -m pytest -q -m cuda -rf --tb=short plugins_quant/awq/tests tests/test_quant_gemm.py >$o/tests.log 2>&1
  echo "tests exit $?"; tail -3 $o/tests.log; pack
  timeout 110 python3 plugins_quant/awq_gemv_tune_gpu.py $o >$o/tune.log 2>&1; echo "tune exit $?"; tail -5 $o/tune.log; pack
  timeout 80 $N bench linear --device cuda --methods unquantized,fp8_w8a16,int8_w8a16,awq --ms 1,4,16 \
    --json $o/bench_linear_s9b.json >$o/bench_linear.log 2>&1; echo "linear exit $?"; tail -16 $o/bench_linear.log; pack
  lat7 70 unquantized awq ;;
s9c)  # session 9, issue 16: the AWQ GEMV with batched loads and atomic split sums: its cuda tests, plan sweep, bench
  # linear, 7B batch-1 latency bf16 / awq / int8_w8a16 (<= 420 s; tarred into OUTDIR/s9c.tgz)
  o=/tmp/s9c; mkdir -p $o; pack() { tar -czf "$out/s9c.tgz" -C $o . ; }
  timeout 90 python3 -m pytest -q -m cuda -rf --tb=short plugins_quant/awq/tests >$o/tests.log 2>&1
  echo "tests exit $?"; tail -3 $o/tests.log; pack
  timeout 90 python3 plugins_quant/awq_gemv_tune_gpu.py $o >$o/tune.log 2>&1; echo "tune exit $?"; tail -5 $o/tune.log; pack
  timeout 60 $N bench linear --device cuda --methods unquantized,int8_w8a16,awq --ms 1,4 \
    --json $o/bench_linear_s9c.json >$o/bench_linear.log 2>&1; echo "linear exit $?"; tail -9 $o/bench_linear.log; pack
  lat7 55 unquantized awq int8_w8a16 ;;
s9d)  # session 9, issue 16: the AWQ GEMV with splits of any 16 rows and no out-of-row reads: memcheck of one case,
  # cuda tests, plan sweep, bench linear, 7B batch-1 latency bf16 / awq / fp8_w8a16 (<= 480 s; OUTDIR/s9d.tgz)
  o=/tmp/s9d; mkdir -p $o; pack() { tar -czf "$out/s9d.tgz" -C $o . ; }
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda -x \
    "plugins_quant/awq/tests/test_gemv_cuda.py::test_gemv_on_qwen_shapes_and_graph_replay" >$o/memcheck.log 2>&1
  echo "memcheck exit $?"; tail -4 $o/memcheck.log; pack
  timeout 90 python3 -m pytest -q -m cuda -rf --tb=short plugins_quant/awq/tests >$o/tests.log 2>&1
  echo "tests exit $?"; tail -3 $o/tests.log; pack
  timeout 100 python3 plugins_quant/awq_gemv_tune_gpu.py $o >$o/tune.log 2>&1; echo "tune exit $?"; cat $o/tune.log; pack
  timeout 70 $N bench linear --device cuda --methods unquantized,fp8_w8a16,int8_w8a16,awq --ms 1,4,16 \
    --json $o/bench_linear_s9d.json >$o/bench_linear.log 2>&1; echo "linear exit $?"; tail -15 $o/bench_linear.log; pack
  lat7 50 unquantized awq fp8_w8a16 ;;
s9f)  # session 9's last call (~150 s): the review's mends on the GPU: awq cuda tests (workspace on the weight, error
  # strings, stricter fits), the int8 fma offset and its one-signed-activation test, bench linear M = 1
  o=/tmp/s9f; mkdir -p $o; pack() { tar -czf "$out/s9f.tgz" -C $o . ; }
  timeout 70 python3 -m pytest -q -m cuda -rf --tb=short plugins_quant/awq/tests/test_gemv_cuda.py tests/test_quant_gemm.py \
    >$o/tests.log 2>&1; echo "tests exit $?"; tail -4 $o/tests.log; pack
  timeout 45 $N bench linear --device cuda --methods unquantized,int8_w8a16,awq --ms 1 --json $o/bench_linear_s9f.json \
    >$o/bench_linear.log 2>&1; echo "linear exit $?"; tail -5 $o/bench_linear.log; pack ;;
s10a)  # next session first (~560 s): the cuda tests session 9 left unrun: test_kernels_attention_cuda.py in two halves
  # (one 210 s step ran 98 of ~146 in s9a), test_kernel_warmup_gpu.py; logs in OUTDIR/s10a.tgz
  o=/tmp/s10a; mkdir -p $o; pack() { tar -czf "$out/s10a.tgz" -C $o . ; }
  f=tests/test_kernels_attention_cuda.py
  python3 -m pytest -q -m cuda --collect-only $f 2>/dev/null | grep "::" >$o/ids.txt
  half=$(( ($(wc -l <$o/ids.txt) + 1) / 2 ))
  for part in 1 2; do
    if [ $part = 1 ]; then ids=$(head -n $half $o/ids.txt); else ids=$(tail -n +$((half + 1)) $o/ids.txt); fi
    timeout 200 python3 -m pytest -q -m cuda -rf --tb=short $ids >$o/attention_cuda_$part.log 2>&1
    echo "attention cuda part $part exit $?"; tail -2 $o/attention_cuda_$part.log; pack
  done
  for spec in tests/test_kernel_warmup_gpu.py:60; do  # (tests/test_kernels_attention.py has no cuda tests)
    f=${spec%:*}; timeout ${spec#*:} python3 -m pytest -q -m cuda -rf --tb=short $f >"$o/$(basename $f .py).log" 2>&1
    echo "$f exit $?"; tail -2 "$o/$(basename $f .py).log"; pack
  done ;;
s10b)  # issue 16 (<= 560 s): ncu of the decode kernels the missed targets run (AWQ CUDA GEMV at qkv / gate_up / down,
  # AWQ Triton at M = 16, int8 GEMV, fp8 default at M = 16), then 7B batch-1 latency with the final awq plan
  o=/tmp/s10b; mkdir -p $o; pack() { tar -czf "$out/s10b.tgz" -C $o . ; }
  NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --launch-skip 3 --launch-count 1"
  for k in awq_cuda:awq_gemv_kernel awq_cuda_qkv:awq_gemv_kernel awq_cuda_down:awq_gemv_kernel \
           awq_triton16:_awq_splitk int8_gemv:_gemv_kernel fp8_default16:_wo_splitk; do
    timeout 45 $NCU -k "regex:${k##*:}" python3 plugins_quant/decode_probe_gpu.py kernel "${k%%:*}" >"$o/ncu_${k%%:*}.txt" 2>&1
    echo "ncu ${k%%:*} exit $?"; grep -E "rel_err|DRAM Throughput|Duration|Registers Per|Achieved Occupancy" "$o/ncu_${k%%:*}.txt"
    pack
  done
  lat7 50 unquantized awq int8_w8a16 ;;
s10c)  # issue 16 (<= 560 s): batch-8 and batch-32 decode through `bench throughput` (prompts 128, outputs 256:
  # decode-dominated), weight-only methods vs bf16, then prefill 4 x 4,096 (the W8A8 methods)
  o=/tmp/s10c; mkdir -p $o; pack() { tar -czf "$out/s10c.tgz" -C $o . ; }
  for m in unquantized awq int8_w8a16 fp8_w8a16; do
    for b in 8 32; do
      timeout 45 $N bench throughput $Q7 --max-model-len 1024 --max-num-seqs $b --num-seqs $b --min-len 128 \
        --max-len 128 --min-output-len 256 --max-output-len 256 --linear-method $m \
        --json $o/decode_b${b}_qwen2.5_7b_$m.json >$o/decode_b${b}_$m.log 2>&1
      echo "decode batch $b $m exit $?"; tail -1 $o/decode_b${b}_$m.log
    done; pack
  done
  for m in unquantized cutlass int8_w8a8 fp8_w8a8; do
    timeout 40 $N bench prefill $Q7 --num-seqs 4 --prompt-len 4096 --max-model-len 4608 --enforce-eager --linear-method $m \
      --json $o/prefill_qwen2.5_7b_$m.json >$o/prefill_$m.log 2>&1; echo "prefill $m exit $?"; tail -1 $o/prefill_$m.log
    pack
  done ;;
s10d)  # issue 16 item 2 (<= 400 s): the one-pass per-token activation quantization (toolkit.act_quant) on the GPU:
  # its cuda tests and the W8A8 plugins', bench linear at prefill sizes, prefill 4 x 4,096 bf16 / int8_w8a8 / fp8_w8a8
  o=/tmp/s10d; mkdir -p $o; pack() { tar -czf "$out/s10d.tgz" -C $o . ; }
  timeout 100 python3 -m pytest -q -m cuda -rf --tb=short tests/test_act_quant.py plugins_quant/int8_w8a8 \
    plugins_quant/fp8_w8a16 >$o/tests.log 2>&1; echo "tests exit $?"; tail -3 $o/tests.log; pack
  timeout 90 $N bench linear --device cuda --methods unquantized,int8_w8a8,fp8_w8a8 --ms 256,1024,4096 \
    --json $o/bench_linear_w8a8.json >$o/bench_linear.log 2>&1; echo "linear exit $?"; tail -12 $o/bench_linear.log; pack
  for m in unquantized int8_w8a8 fp8_w8a8; do
    timeout 45 $N bench prefill $Q7 --num-seqs 4 --prompt-len 4096 --max-model-len 4608 --enforce-eager --linear-method $m \
      --json $o/prefill_qwen2.5_7b_$m.json >$o/prefill_$m.log 2>&1; echo "prefill $m exit $?"; tail -1 $o/prefill_$m.log
    pack
  done ;;
s10e)  # issue 16 batch-32 decode (<= 330 s): weight-only split-K up to 32 rows (weight_only_config): the GEMM cuda
  # tests, bench linear at M = 16 / 32, then batch-32 decode per weight-only method vs bf16 (same workload as s10c)
  o=/tmp/s10e; mkdir -p $o; pack() { tar -czf "$out/s10e.tgz" -C $o . ; }
  timeout 80 python3 -m pytest -q -m cuda -rf --tb=short tests/test_quant_gemm.py plugins_quant/awq/tests/test_kernels.py \
    >$o/tests.log 2>&1; echo "tests exit $?"; tail -3 $o/tests.log; pack
  timeout 60 $N bench linear --device cuda --methods unquantized,fp8_w8a16,int8_w8a16,awq --ms 16,32 \
    --json $o/bench_linear_m32.json >$o/bench_linear.log 2>&1; echo "linear exit $?"; tail -10 $o/bench_linear.log; pack
  for m in unquantized fp8_w8a16 int8_w8a16 awq; do
    timeout 40 $N bench throughput $Q7 --max-model-len 1024 --max-num-seqs 32 --num-seqs 32 --min-len 128 \
      --max-len 128 --min-output-len 256 --max-output-len 256 --linear-method $m \
      --json $o/decode_b32_qwen2.5_7b_$m.json >$o/decode_b32_$m.log 2>&1
    echo "decode batch 32 $m exit $?"; tail -1 $o/decode_b32_$m.log; pack
  done ;;
s10f)  # the act_quant scale fix on the GPU (<= 120 s): its cuda tests and the W8A8 plugins'
  o=/tmp/s10f; mkdir -p $o; pack() { tar -czf "$out/s10f.tgz" -C $o . ; }
  timeout 100 python3 -m pytest -q -m cuda -rf --tb=short tests/test_act_quant.py plugins_quant/int8_w8a8 \
    plugins_quant/fp8_w8a16 >$o/tests.log 2>&1; echo "tests exit $?"; tail -4 $o/tests.log; pack ;;
s11a)  # next session first (<= 300 s): session 10's last mends on the GPU (act_quant NaN / Inf rows, strided and
  # float32 inputs; awq split-K at M = 24 / 32), then the W8A8 prefill re-timed with the final quantizer
  o=/tmp/s11a; mkdir -p $o; pack() { tar -czf "$out/s11a.tgz" -C $o . ; }
  timeout 150 python3 -m pytest -q -m cuda -rf --tb=short tests/test_act_quant.py tests/test_quant_gemm.py \
    plugins_quant/awq/tests/test_kernels.py plugins_quant/awq/tests/test_gemv_cuda.py plugins_quant/int8_w8a8 \
    plugins_quant/fp8_w8a16 >$o/tests.log 2>&1
  echo "tests exit $?"; tail -4 $o/tests.log; pack
  for m in unquantized int8_w8a8 fp8_w8a8; do
    timeout 40 $N bench prefill $Q7 --num-seqs 4 --prompt-len 4096 --max-model-len 4608 --enforce-eager --linear-method $m \
      --json $o/prefill_qwen2.5_7b_$m.json >$o/prefill_$m.log 2>&1; echo "prefill $m exit $?"; tail -1 $o/prefill_$m.log
    pack
  done ;;
s11b)  # issue 19 item 2 (<= 560 s): the fused q / k RMSNorm + RoPE and the dropped v copy, before (BEFORE_TAR: a
  # git archive of the parent commit, run from its own tree) and after (this tree) in one call: the new cuda tests
  # and the engine's (graphs == eager), step profiles at batch 1 and 256 x 512, 0.6B / 7B batch-1 latency, throughput
  o=/tmp/s11b; mkdir -p $o; pack() { tar -czf "$out/s11b.tgz" -C $o . ; }
  rm -rf /tmp/b; mkdir -p /tmp/b && tar -xf "${BEFORE_TAR:?set BEFORE_TAR}" -C /tmp/b || exit 1
  timeout 150 python3 -m pytest -q -m cuda -rf --tb=short tests/test_kernels_small_ops.py tests/test_gpu_engine.py \
    >$o/tests.log 2>&1; echo "tests exit $?"; tail -3 $o/tests.log; pack
  # the JSONs' git_commit: BEFORE_COMMIT for the before tree (session 11's call lacked it: its *_before.json say a9b3842)
  commit_of() { if [ "$1" = before ]; then echo "${BEFORE_COMMIT:-unknown-before}"; else echo "$NANOCORE_GIT_COMMIT"; fi; }
  here=$PWD; (cd /tmp/b && python3 -c "import nanocore; print('before tree imports', nanocore.__file__)")
  for tree in after before; do d=$here; [ $tree = before ] && d=/tmp/b
    (cd $d && NANOCORE_GIT_COMMIT=$(commit_of $tree) timeout 110 python3 -m benchmarks.step_profile $Q06 --batch-sizes 1 256 --context-len 512 \
      --kernel-table 16 --json $o/step_profile_0.6b_$tree.json >$o/step_profile_$tree.log 2>&1)
    echo "step_profile $tree exit $?"; grep -A3 "^batch_size  context_len  step_ms" $o/step_profile_$tree.log | head -3; pack
  done
  for tree in after before; do d=$here; [ $tree = before ] && d=/tmp/b
    (cd $d && NANOCORE_GIT_COMMIT=$(commit_of $tree) timeout 45 $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 \
      --json $o/latency_qwen3_0.6b_$tree.json >$o/latency_0.6b_$tree.log 2>&1); echo "latency 0.6b $tree exit $?"
    tail -1 $o/latency_0.6b_$tree.log; pack
  done
  for tree in after before; do d=$here; [ $tree = before ] && d=/tmp/b
    (cd $d && NANOCORE_GIT_COMMIT=$(commit_of $tree) timeout 80 $N bench throughput $Q06 --max-model-len 2048 \
      --json $o/throughput_qwen3_0.6b_$tree.json >$o/throughput_$tree.log 2>&1); echo "throughput $tree exit $?"
    tail -1 $o/throughput_$tree.log; pack
  done
  for tree in after before; do d=$here; [ $tree = before ] && d=/tmp/b
    (cd $d && NANOCORE_GIT_COMMIT=$(commit_of $tree) timeout 55 $N bench latency $Q7 --max-num-seqs 8 --max-model-len 1024 \
      --json $o/latency_qwen2.5_7b_$tree.json >$o/latency_7b_$tree.log 2>&1); echo "latency 7b $tree exit $?"
    tail -1 $o/latency_7b_$tree.log; pack
  done ;;
s11c)  # issues 16 / 19 / 17 (<= 590 s; OUTDIR/s11c.tgz after each step): prefill 4 x 4096 bf16 / int8_w8a8 /
  # fp8_w8a8 at the final quantizer (s11a's 40 s limits were too short for cold compiles); throughput of three
  # workloads against their memory floors (nano-vllm; many short: 512 x 128..512 in / out; long: 128 x 512..2048
  # in, 256..1024 out); the KV-bound pair with the current decode tiles (never measured: the 1-warp tile's runs
  # timed out at ea0a1b0 while compiling); last, ncu of the engine's default one-byte decode kernel at 64 x 4K
  o=/tmp/s11c; mkdir -p $o; pack() { tar -czf "$out/s11c.tgz" -C $o . ; }
  for m in unquantized int8_w8a8 fp8_w8a8; do
    timeout 70 $N bench prefill $Q7 --num-seqs 4 --prompt-len 4096 --max-model-len 4608 --enforce-eager --linear-method $m \
      --json $o/prefill_qwen2.5_7b_$m.json >$o/prefill_$m.log 2>&1; echo "prefill $m exit $?"; tail -1 $o/prefill_$m.log
    pack
  done
  for w in "nano_vllm" "short_512 --num-seqs 512 --min-len 128 --max-len 512 --max-num-seqs 512" \
      "long_128 --num-seqs 128 --min-len 512 --max-len 2048 --min-output-len 256 --max-output-len 1024 --max-model-len 4096"; do
    set -- $w; tag=$1; shift
    timeout 75 $N bench throughput $Q06 --max-model-len 2048 "$@" --json $o/throughput_qwen3_0.6b_$tag.json \
      >$o/throughput_$tag.log 2>&1; echo "throughput $tag exit $?"; tail -2 $o/throughput_$tag.log; pack
  done
  for c in k_int8_v_fp8 unquantized; do
    timeout 130 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json "$o/throughput_kv_bound_llama3.1_8b_$c.json" >$o/kv_bound_$c.log 2>&1
    echo "kv-bound $c exit $?"; tail -2 $o/kv_bound_$c.log; pack
  done
  timeout 60 ncu --clock-control none --set full -k regex:paged_attention_kernel --launch-skip 4 --launch-count 1 \
    -o $o/ncu_int8_default python3 -m benchmarks.attention_probe int8 >$o/ncu_int8_default.log 2>&1
  echo "ncu exit $?"; tail -2 $o/ncu_int8_default.log
  ncu -i $o/ncu_int8_default.ncu-rep --page details --csv >$o/ncu_int8_default.details.csv 2>&1
  rm -f $o/ncu_int8_default.ncu-rep; pack ;;
s11d)  # the per-step logits in the model dtype (a6be50a) on the GPU (<= 170 s): sampling tests on cuda tensors, the
  # engine's cuda tests, then the step profile whose batch-256 table showed the float32 logits copy (112 us)
  o=/tmp/s11d; mkdir -p $o; pack() { tar -czf "$out/s11d.tgz" -C $o . ; }
  timeout 100 python3 -m pytest -q -rf --tb=short tests/test_kernels_sampling.py tests/test_sampling.py \
    tests/test_gpu_engine.py >$o/tests.log 2>&1; echo "tests exit $?"; tail -3 $o/tests.log; pack
  timeout 65 python3 -m benchmarks.step_profile $Q06 --batch-sizes 1 256 --context-len 512 --kernel-table 16 \
    --json $o/step_profile_0.6b.json >$o/step_profile.log 2>&1; echo "step_profile exit $?"
  grep -A3 "^batch_size  context_len  step_ms" $o/step_profile.log | head -3; pack ;;
s12a)  # next session first (<= 200 s): session 11's post-review code on the GPU: the fused q / k norm + RoPE tests in
  # their own file (the (weight, eps) API, the partial-rotary fallback) and the engine's, incl. the tiny Qwen3 greedy case
  o=/tmp/s12a; mkdir -p $o; pack() { tar -czf "$out/s12a.tgz" -C $o . ; }
  timeout 180 python3 -m pytest -q -rf --tb=short tests/test_kernels_rotary.py tests/test_kernels_small_ops.py \
    tests/test_gpu_engine.py >$o/tests.log 2>&1; echo "tests exit $?"; tail -4 $o/tests.log; pack ;;
s12b)  # issue 17, session 12: the CUDA-core one-byte decode kernel: its cuda tests, then its tiles against bf16 and the
  # engine's default at 64 x 4K, 256 x 512 and 1 x 16K, GQA 2 / 4 / 7 (<= 560 s)
  o=/tmp/s12b; mkdir -p $o; pack() { tar -czf "$out/s12b.tgz" -C $o . ; }
  timeout 150 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_narrow_decode.py >$o/tests.log 2>&1
  echo "tests exit $?"; tail -4 $o/tests.log; pack
  timeout 400 python3 -m benchmarks.attention_decode_sweep $o --variants cuda_core --workers 14 >$o/sweep.log 2>&1
  echo "sweep exit $?"; tail -70 $o/sweep.log; pack ;;
s12c)  # issue 17, session 12: the grid order of decode grids (KV heads as neighbouring programs) for bf16, the
  # current one-byte default and the CUDA-core kernel (<= 300 s), then the new cuda tests
  o=/tmp/s12c; mkdir -p $o; pack() { tar -czf "$out/s12c.tgz" -C $o . ; }
  timeout 240 python3 -m benchmarks.attention_decode_sweep $o --variants grid --workers 14 >$o/sweep.log 2>&1
  echo "sweep exit $?"; tail -75 $o/sweep.log; pack
  timeout 100 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_narrow_decode.py >$o/tests.log 2>&1
  echo "tests exit $?"; tail -3 $o/tests.log; pack ;;
s12d)  # issue 17, session 12 (<= 560 s): can a decode step read a one-byte paged cache faster than the kernels do
  # (decode_read_probe: reads only), ncu of the CUDA-core kernel at 64 x 4K, where prefill 8 x 4096's codec gap goes
  # (kernel table per codec), then session 11's post-review cuda tests (s12a)
  o=/tmp/s12d; mkdir -p $o; pack() { tar -czf "$out/s12d.tgz" -C $o . ; }
  timeout 120 python3 -m benchmarks.decode_read_probe $o >$o/read_probe.log 2>&1; echo "read probe exit $?"
  cat $o/read_probe.log | tail -40; pack
  timeout 80 ncu --clock-control none --set full -k regex:narrow_decode --launch-skip 4 --launch-count 1 \
    -o $o/ncu_int8_cuda_core python3 -m benchmarks.attention_probe int8 cuda_core --tile 16/1/1 >$o/ncu.log 2>&1
  echo "ncu exit $?"; tail -2 $o/ncu.log
  ncu -i $o/ncu_int8_cuda_core.ncu-rep --page details --csv >$o/ncu_int8_cuda_core.details.csv 2>&1
  rm -f $o/ncu_int8_cuda_core.ncu-rep; pack
  timeout 150 python3 -m benchmarks.prefill_kernel_table $o/prefill_kernel_table.json >$o/prefill.log 2>&1
  echo "prefill table exit $?"; tail -30 $o/prefill.log; pack
  timeout 180 python3 -m pytest -q -rf --tb=short tests/test_kernels_rotary.py tests/test_kernels_small_ops.py \
    tests/test_gpu_engine.py >$o/tests.log 2>&1; echo "tests exit $?"; tail -4 $o/tests.log; pack ;;
s12e)  # issue 17, session 12 (<= 500 s): the codec gap of prefill 8 x 4096 by kernel (s12d's run had a token-id bug),
  # Nano-vLLM throughput bf16 / k_int8_v_fp8 / k_int8_v_fp8 with the CUDA-core decode path, one call; the read probe
  # on head-major pages (a head's page one run), then at 8 and 16 splits
  o=/tmp/s12e; mkdir -p $o; pack() { tar -czf "$out/s12e.tgz" -C $o . ; }
  timeout 100 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_narrow_decode.py >$o/tests.log 2>&1
  timeout 60 python3 -m pytest -q -rf --tb=short tests/test_kernels_small_ops.py -k rotary_in_place >>$o/tests.log 2>&1
  echo "tests exit $?"; grep -E "passed|failed" $o/tests.log; pack
  timeout 150 python3 -m benchmarks.prefill_kernel_table $o/prefill_kernel_table.json >$o/prefill.log 2>&1
  echo "prefill table exit $?"; tail -30 $o/prefill.log; pack
  for run in "unquantized unquantized" "k_int8_v_fp8 k_int8_v_fp8" "k_int8_v_fp8_cuda_core k_int8_v_fp8 cuda_core"; do
    set -- $run
    NANOCORE_ATTN_QUANT_PATH=$3 timeout 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $2 \
      --json $o/throughput_qwen3_0.6b_$1.json >$o/throughput_$1.log 2>&1; echo "throughput $1 exit $?"
    tail -1 $o/throughput_$1.log; pack
  done
  timeout 60 python3 -m benchmarks.decode_read_probe $o --head-major --splits 1 4 8 >$o/read_probe_hm.log 2>&1
  echo "read probe head-major exit $?"; cat $o/read_probe_hm.log; pack
  timeout 90 python3 -m benchmarks.decode_read_probe $o --splits 8 16 >$o/read_probe.log 2>&1; echo "read probe exit $?"
  grep -E "128/4|16/1" $o/read_probe.log; pack ;;
s12f)  # s12e cut to what session 12's last device minutes allowed (<= 260 s): the cuda tests, the head-major read
  # probe, the prefill kernel table per codec
  o=/tmp/s12f; mkdir -p $o; pack() { tar -czf "$out/s12f.tgz" -C $o . ; }
  timeout 70 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_narrow_decode.py >$o/tests.log 2>&1
  timeout 30 python3 -m pytest -q -rf --tb=short tests/test_kernels_small_ops.py -k rotary_in_place >>$o/tests.log 2>&1
  echo "tests exit $?"; grep -E "passed|failed" $o/tests.log; pack
  timeout 45 python3 -m benchmarks.decode_read_probe $o --head-major --splits 1 4 >$o/read_probe_hm.log 2>&1
  echo "read probe head-major exit $?"; cat $o/read_probe_hm.log; pack
  timeout 130 python3 -m benchmarks.prefill_kernel_table $o/prefill_kernel_table.json >$o/prefill.log 2>&1
  echo "prefill table exit $?"; tail -30 $o/prefill.log; pack ;;
s13a)  # issue 17, session 13 (<= 560 s): the deciding read probe on head-major pages, the prefill 8 x 4096 kernel table
  # per codec, then session 12's refactored kernels on the GPU (attention and CUDA-core decode cuda tests, in-place rotary)
  o=/tmp/s13a; mkdir -p $o; pack() { tar -czf "$out/s13a.tgz" -C $o . ; }
  timeout 60 python3 -m benchmarks.decode_read_probe $o --head-major --splits 1 4 8 >$o/read_probe_hm.log 2>&1
  echo "read probe head-major exit $?"; cat $o/read_probe_hm.log | tail -30; pack
  timeout 140 python3 -m benchmarks.prefill_kernel_table $o/prefill_kernel_table.json >$o/prefill.log 2>&1
  echo "prefill table exit $?"; tail -30 $o/prefill.log; pack
  timeout 150 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_attention_cuda.py >$o/tests.log 2>&1
  echo "attention tests exit $?"; tail -3 $o/tests.log; pack
  timeout 100 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_narrow_decode.py >>$o/tests.log 2>&1
  echo "narrow tests exit $?"
  timeout 50 python3 -m pytest -q -rf --tb=short tests/test_kernels_small_ops.py -k rotary_in_place >>$o/tests.log 2>&1
  echo "rotary tests exit $?"; grep -E "passed|failed" $o/tests.log; pack ;;
s13b)  # issue 17, session 13 (<= 560 s): reading alone (the word probe: no per-byte cvt), bench prefill 8 x 4096 per
  # codec in one call, Nano-vLLM throughput bf16 / k_int8_v_fp8 / k_int8_v_fp8 with the CUDA-core decode path
  o=/tmp/s13b; mkdir -p $o; pack() { tar -czf "$out/s13b.tgz" -C $o . ; }
  timeout 90 python3 -m benchmarks.decode_read_probe $o --words --splits 4 8 >$o/read_probe_words.log 2>&1
  echo "word probe exit $?"; cat $o/read_probe_words.log | tail -50; pack
  for c in unquantized int8 fp8_e4m3 k_int8_v_fp8; do
    timeout 50 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --kv-codec $c \
      --json $o/prefill_qwen3_0.6b_$c.json >$o/prefill_$c.log 2>&1; echo "prefill $c exit $?"; tail -1 $o/prefill_$c.log
  done; pack
  for run in "unquantized unquantized" "k_int8_v_fp8 k_int8_v_fp8" "k_int8_v_fp8_cuda_core k_int8_v_fp8 cuda_core"; do
    set -- $run
    NANOCORE_ATTN_QUANT_PATH=$3 timeout 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $2 \
      --json $o/throughput_qwen3_0.6b_$1.json >$o/throughput_$1.log 2>&1; echo "throughput $1 exit $?"
    tail -1 $o/throughput_$1.log; pack
  done ;;
s13c)  # issue 17, session 13 (<= 570 s): the decode ladder (read -> convert -> dots -> softmax, where the bytes/s
  # go), bench prefill bf16 / fp8_e4m3 (s13b's fp8 run passed its 50 s), the refactored attention kernels' cuda tests
  o=/tmp/s13c; mkdir -p $o; pack() { tar -czf "$out/s13c.tgz" -C $o . ; }
  timeout 120 python3 -m benchmarks.decode_ladder_probe $o >$o/ladder.log 2>&1; echo "ladder exit $?"
  cat $o/ladder.log | tail -40; pack
  for c in unquantized fp8_e4m3; do
    timeout 100 $N bench prefill $Q06 --num-seqs 8 --prompt-len 4096 --max-model-len 4608 --kv-codec $c \
      --json $o/prefill_qwen3_0.6b_$c.json >$o/prefill_$c.log 2>&1; echo "prefill $c exit $?"; tail -3 $o/prefill_$c.log
  done; pack
  timeout 300 python3 -m pytest -q -rf --tb=short -m cuda tests/test_kernels_attention_cuda.py >$o/tests.log 2>&1
  echo "attention tests exit $?"; tail -3 $o/tests.log; pack ;;
s13d)  # issue 17, session 13 (<= 200 s): int8 Q K^T on the stored bytes (ladder byte_qk vs dots), then ncu of the
  # ladder's convert and dots stages (int8, 32 keys / 1 warp, 3 stages, 4 splits: s13c 179.5 -> 188.2 us)
  o=/tmp/s13d; mkdir -p $o; pack() { tar -czf "$out/s13d.tgz" -C $o . ; }
  timeout 60 python3 -m benchmarks.decode_ladder_probe $o --levels dots byte_qk --tiles 16/1 32/1 --stages 3 \
    --dtypes int8 >$o/ladder_byte_qk.log 2>&1; echo "ladder exit $?"; cat $o/ladder_byte_qk.log; pack
  for lv in dots convert; do tag=${lv}_32_1; mkdir -p $o/$tag  # (its own folder: the ladder's JSON has one name)
    timeout 45 ncu --clock-control none --set full -k regex:_ladder_kernel --launch-count 1 -o $o/ncu_$tag \
      python3 -m benchmarks.decode_ladder_probe $o/$tag --levels $lv --tiles 32/1 --stages 3 --dtypes int8 >$o/ncu_$tag.log 2>&1
    echo "ncu $tag exit $?"; ncu -i $o/ncu_$tag.ncu-rep --page details --csv >$o/ncu_$tag.details.csv 2>&1
    rm -f $o/ncu_$tag.ncu-rep; pack; done ;;
s14a)  # session 14 first (issue 17, <= 530 s): where the codec's decode steps lose at the Nano-vLLM lengths (graph
  # replay and kernel table, batch 256 x 256 / 1024 context) and at batch 1 (TPOT's 128-token step), per codec
  o=/tmp/s14a; mkdir -p $o; pack() { tar -czf "$out/s14a.tgz" -C $o . ; }; t0=$SECONDS
  for c in unquantized k_int8_v_fp8 int8; do
    timeout 110 python3 -m benchmarks.step_profile --model dummy:Qwen3-0.6B --batch-sizes 1 256 --context-len 128 1024 \
      --kv-codec $c --kernel-table 12 --json $o/step_profile_0.6b_$c.json >$o/step_profile_$c.log 2>&1
    echo "step_profile $c exit $?"; grep -A4 "^batch_size" $o/step_profile_$c.log | head -6; pack
  done
  # the KV-bound workload's decode steps (Llama-3.1-8B shapes, 256 x 2,048: what bf16 holds) in what time is left
  for c in unquantized k_int8_v_fp8; do
    left=$((530 - SECONDS + t0)); [ $left -lt 60 ] && { echo "skip llama $c: $left s left"; continue; }
    [ $c = unquantized ] && left=$((left / 2 > 60 ? left / 2 : 60))  # the codec's run gets the rest
    timeout $left python3 -m benchmarks.step_profile --model dummy:Llama-3.1-8B \
      --batch-sizes 256 --context-len 2048 --max-model-len 4096 --steps 10 --kv-codec $c --kernel-table 12 \
      --json $o/step_profile_llama8b_$c.json >$o/step_profile_llama8b_$c.log 2>&1
    echo "step_profile llama8b $c exit $?"; grep -A2 "^batch_size" $o/step_profile_llama8b_$c.log | head -3; pack
  done ;;
s14b)  # issue 17 (<= 540 s): the throughput pass step by step per codec (which steps the codec loses); ncu of the decode
  # kernel at the TPOT (1 x 128), throughput (256 x 1024) and KV-bound (Llama-3.1-8B heads, 256 x 2048) shapes;
  # batch-1 decode tiles x splits, graph-timed, in what time is left
  o=/tmp/s14b; mkdir -p $o; pack() { tar -czf "$out/s14b.tgz" -C $o . ; }; t0=$SECONDS
  for c in unquantized k_int8_v_fp8; do
    timeout 110 python3 -m benchmarks.throughput_timeline --kv-codec $c --json $o/timeline_$c.json >$o/timeline_$c.log 2>&1
    echo "timeline $c exit $?"; grep -v "^wrote" $o/timeline_$c.log | head -14; pack
  done
  for spec in "bf16 1 128 16" "k_int8_v_fp8 1 128 16" "bf16 256 1024 16" "k_int8_v_fp8 256 1024 16" \
              "bf16 256 2048 32" "k_int8_v_fp8 256 2048 32"; do
    set -- $spec; tag=$1_$2x$3_h$4
    timeout 60 ncu --clock-control none --set full -k regex:"paged_attention|narrow_decode" --launch-skip 4 \
      --launch-count 1 -o $o/ncu_$tag python3 -m benchmarks.attention_probe $1 --seqs $2 --ctx $3 --heads $4 \
      --kv-heads 8 >$o/ncu_$tag.log 2>&1
    echo "ncu $tag exit $?"; ncu -i $o/ncu_$tag.ncu-rep --page details --csv >$o/ncu_$tag.details.csv 2>&1
    rm -f $o/ncu_$tag.ncu-rep; pack
  done
  left=$((540 - SECONDS + t0)); echo "sweep gets $left s"; [ $left -lt 30 ] && left=30  # timeout 0 would not stop it
  timeout $left python3 -m benchmarks.attention_decode_sweep $o --variants batch1 >$o/sweep_batch1.log 2>&1
  echo "sweep exit $?"; grep -v "^compiled" $o/sweep_batch1.log | tail -40; pack ;;
s14c)  # issue 17 (<= 530 s): cuda tests of the split KV store and the few-programs decode tile; decode batches of mixed
  # lengths (1-warp tiles x splits); Nano-vLLM throughput bf16 / k_int8_v_fp8 at 1-warp min splits 1, 2, 4; batch-1
  # latency (TPOT) per codec with the new few-programs tile and store
  o=/tmp/s14c; mkdir -p $o; pack() { tar -czf "$out/s14c.tgz" -C $o . ; }; t0=$SECONDS
  timeout 150 python3 -m pytest -q -m cuda -rf --tb=short tests/test_kernels_kv_store.py tests/test_kernels_attention_cuda.py \
    -k "store or quantized_layouts or quantized_paths or long_decode or graph_capture" >$o/tests.log 2>&1
  echo "tests exit $?"; tail -4 $o/tests.log; pack
  timeout 100 python3 -m benchmarks.attention_decode_sweep $o --variants mixed >$o/sweep_mixed.log 2>&1
  echo "sweep exit $?"; grep -v "^compiled" $o/sweep_mixed.log | tail -34; pack
  lat() { local c=$1 left=$((530 - SECONDS + t0)); [ $left -lt 30 ] && { echo "skip latency $c: $left s left"; return; }
    timeout $((left < 45 ? left : 45)) $N bench latency $Q06 --max-num-seqs 8 --max-model-len 1024 --kv-codec $c \
      --json $o/latency_qwen3_0.6b_$c.json >$o/latency_$c.log 2>&1
    echo "latency $c exit $?"; grep -A1 "tpot" $o/latency_$c.log | tail -2 | cut -c1-160; pack; }
  thr() { local left=$((530 - SECONDS + t0)); [ $left -lt 100 ] && { echo "skip throughput $*: $left s left"; return; }
    NANOCORE_ATTN_DECODE_MIN_SPLITS=$2 timeout 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $1 \
      --json $o/throughput_$1_min$2.json >$o/throughput_$1_min$2.log 2>&1
    echo "throughput $* exit $?"; grep -A1 "^model" $o/throughput_$1_min$2.log | tail -1 | cut -c1-120; pack; }
  lat unquantized; lat k_int8_v_fp8
  thr unquantized 1; thr k_int8_v_fp8 1; thr k_int8_v_fp8 2
  lat int8; lat fp8_e4m3; thr k_int8_v_fp8 4 ;;
s14d)  # issue 17 (<= 150 s): ncu of the decode kernel on the Nano-vLLM workload's mixed-length batches (bf16 and
  # k_int8_v_fp8 at 256 x U[100, 1024], k_int8_v_fp8 at 158 x U[300, 1521]), the throughput target's limiter
  o=/tmp/s14d; mkdir -p $o; pack() { tar -czf "$out/s14d.tgz" -C $o . ; }
  for spec in "bf16 256 100 1024" "k_int8_v_fp8 256 100 1024" "k_int8_v_fp8 158 300 1521"; do
    set -- $spec; tag=$1_$2xU$3-$4
    timeout 45 ncu --clock-control none --set full -k regex:"paged_attention|narrow_decode" --launch-skip 4 \
      --launch-count 1 -o $o/ncu_$tag python3 -m benchmarks.attention_probe $1 --seqs $2 --ctx-range $3 $4 \
      >$o/ncu_$tag.log 2>&1
    echo "ncu $tag exit $?"; ncu -i $o/ncu_$tag.ncu-rep --page details --csv >$o/ncu_$tag.details.csv 2>&1
    rm -f $o/ncu_$tag.ncu-rep; pack
  done ;;
s15a)  # next session first (issue 17, <= 540 s): the longest-first decode order (session 14, opt-in, CPU-tested
  # only): its tests on the GPU, the mixed-length sweep with longest-first batches and heads-first grids, Nano-vLLM
  # throughput bf16 / k_int8_v_fp8 with and without it (one call); ncu at the targets' shapes not yet profiled:
  # 64 x 4K at GQA 7 (28 q / 4 KV heads) and 1 x 16K at GQA 2, bf16 and k_int8_v_fp8
  o=/tmp/s15a; mkdir -p $o; pack() { tar -czf "$out/s15a.tgz" -C $o . ; }
  timeout 90 python3 -m pytest -q -rf --tb=short tests/test_decode_order.py >$o/tests.log 2>&1
  echo "tests exit $?"; tail -3 $o/tests.log; pack
  for run in "unquantized batch" "unquantized longest_first" "k_int8_v_fp8 batch" "k_int8_v_fp8 longest_first"; do
    set -- $run
    NANOCORE_ATTN_DECODE_ORDER=$2 timeout 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $1 \
      --json $o/throughput_$1_$2.json >$o/throughput_$1_$2.log 2>&1
    echo "throughput $run exit $?"; grep -A1 "^model" $o/throughput_$1_$2.log | tail -1 | cut -c1-120; pack
  done
  timeout 120 python3 -m benchmarks.attention_decode_sweep $o --variants mixed >$o/sweep_mixed.log 2>&1
  echo "sweep exit $?"; grep -v "^compiled" $o/sweep_mixed.log | tail -60; pack
  for spec in "bf16 64 4096 28 4" "k_int8_v_fp8 64 4096 28 4" "bf16 1 16384 16 8" "k_int8_v_fp8 1 16384 16 8"; do
    ncu_decode_probe $o $spec; pack
  done ;;
s15b)  # issue 17 (<= 560 s; also the first GPU run of the split-KV module move): the order's tests on CUDA again (s15a: a test built its order on the CPU and the cuda
  # engine test did not finish in 90 s; the host check now refuses an order on another device), batch-1 decode at
  # 4K / 16K context (tiles x splits, graph-timed: s15a's ncu found the few-programs tile 1.94x bf16 at 1 x 16K),
  # TPOT at 16K: bf16, k_int8_v_fp8 with the default (32/4/3, 64 splits), session 13's 128/4/2 (32 splits) and session 8's
  # 1-warp 32/1/3 (64 splits) tiles; longest-first is the default
  o=/tmp/s15b; mkdir -p $o; pack() { tar -czf "$out/s15b.tgz" -C $o . ; }
  timeout 150 python3 -m pytest -q -rf --tb=short --durations=5 tests/test_decode_order.py >$o/tests.log 2>&1
  echo "tests exit $?"; tail -12 $o/tests.log; pack
  timeout 150 python3 -m benchmarks.attention_decode_sweep $o --variants batch1long >$o/sweep_batch1long.log 2>&1
  echo "sweep exit $?"; grep -v "^compiled" $o/sweep_batch1long.log | tail -45; pack
  for run in "unquantized default" "k_int8_v_fp8 default" "k_int8_v_fp8 128/4/2" "k_int8_v_fp8 32/1/3"; do
    set -- $run; tag=$1_${2//\//_}
    NANOCORE_ATTN_DECODE_TILE=$([ $2 = default ] || echo $2) timeout 70 $N bench latency $Q06 --max-num-seqs 8 \
      --max-model-len 16640 --prompt-len 16384 --kv-codec $1 --json $o/latency_16k_$tag.json >$o/latency_16k_$tag.log 2>&1
    echo "latency 16k $run exit $?"; tail -2 $o/latency_16k_$tag.log | cut -c1-160; pack
  done ;;
s15c)  # issue 17 (<= 330 s; session 14's tile last, the first to drop if the device time runs out): the few-programs tile is now 1-warp, split to one tile per split (after s15b): batch-1
  # kernel at 128 / 1K (session 14's 32/4/3 against it), TPOT 128 / 128 and at 16K, bf16 / k_int8_v_fp8 (same call),
  # then TPOT 128 / 128 with session 14's tile (NANOCORE_ATTN_DECODE_TILE=32/4/3)
  o=/tmp/s15c; mkdir -p $o; pack() { tar -czf "$out/s15c.tgz" -C $o . ; }
  timeout 100 python3 -m benchmarks.attention_decode_sweep $o --variants batch1short >$o/sweep_batch1short.log 2>&1
  echo "sweep exit $?"; grep -v "^compiled" $o/sweep_batch1short.log | tail -30; pack
  for run in "unquantized default 1024 128" "k_int8_v_fp8 default 1024 128" "unquantized default 16640 16384" \
             "k_int8_v_fp8 default 16640 16384" "k_int8_v_fp8 32/4/3 1024 128"; do
    set -- $run; tag=$1_${2//\//_}_$4
    NANOCORE_ATTN_DECODE_TILE=$([ $2 = default ] || echo $2) timeout 70 $N bench latency $Q06 --max-num-seqs 8 \
      --max-model-len $3 --prompt-len $4 --kv-codec $1 --json $o/latency_$tag.json >$o/latency_$tag.log 2>&1
    echo "latency $run exit $?"; tail -2 $o/latency_$tag.log | cut -c1-160; pack
  done ;;
s16b)  # session 16 (issue 17, <= 560 s): decode graphs per context tier. Their cuda tests first (a failure ends the
  # section); TPOT 128 / 128 at max_model_len 40,960 (the
  # model's own: short contexts ran the 64-split tiles) and 2,048, bf16 / k_int8_v_fp8; ncu of the 1 x 16K config;
  # the throughput pass step by step (longest-first grids, tiered graphs). The first s16b call also ran
  # tests/test_gpu_engine.py and tests/test_kernel_warmup_gpu.py (passed). s16a, its predecessor on the code before the
  # tiers, never ran and is gone (git show f139a21:benchmarks/gpu_suite_sessions.sh)
  o=/tmp/s16b; mkdir -p $o; pack() { tar -czf "$out/s16b.tgz" -C $o . ; }
  timeout 200 python3 -m pytest -q -m cuda -rf --tb=short tests/test_decode_graph_tiers.py tests/test_decode_order.py \
    >$o/tests.log 2>&1
  rc=$?; echo "tests exit $rc"; tail -15 $o/tests.log; pack
  [ $rc = 0 ] || return
  for run in "unquantized 40960" "k_int8_v_fp8 40960" "unquantized 2048" "k_int8_v_fp8 2048"; do
    set -- $run; lat06 60 $1_$2 --max-model-len $2 --kv-codec $1; grep -i "captured" $o/latency_$1_$2.log | cut -c1-300
    pack
  done
  for spec in "bf16 1 16384 16 8" "k_int8_v_fp8 1 16384 16 8"; do
    ncu_decode_probe $o $spec; pack
  done
  for c in unquantized k_int8_v_fp8; do
    timeout 110 python3 -m benchmarks.throughput_timeline --kv-codec $c --json $o/timeline_$c.json >$o/timeline_$c.log 2>&1
    echo "timeline $c exit $?"; grep -v "^wrote" $o/timeline_$c.log | head -14; pack
  done ;;
s16c)  # session 16 (issue 17, <= 560 s): the KV-bound workload with the current defaults (longest-first grids, tiered
  # decode graphs; its last figure is session 11's 1.31x), bf16 and k_int8_v_fp8 first, then int8 and fp8_e4m3
  o=/tmp/s16c; mkdir -p $o; pack() { tar -czf "$out/s16c.tgz" -C $o . ; }
  for c in unquantized k_int8_v_fp8 int8 fp8_e4m3; do
    timeout 130 $N bench throughput --workload kv-bound --model dummy:Llama-3.1-8B --device cuda --dtype bfloat16 \
      --warmup one --kv-codec $c --json $o/throughput_kv_bound_llama3.1_8b_$c.json >$o/kv_bound_$c.log 2>&1
    echo "kv-bound $c exit $?"; tail -3 $o/kv_bound_$c.log | cut -c1-160; pack
  done ;;
s17a)  # next session first (issue 17, <= 560 s): what session 16 changed after its last call. The few-program decode
  # grids' one-tile splits (choose_num_splits(decode=True)) with the context tiers: the attention and tiers cuda tests,
  # TPOT 128 / 128 at max_model_len 2,048 and 40,960 (s16b: 1.047x / 1.054x with the 4-tile floor), then the
  # Nano-vLLM `bench throughput` pair (the last bench figure, 1.004x, is s15a's, before the tiers)
  o=/tmp/s17a; mkdir -p $o; pack() { tar -czf "$out/s17a.tgz" -C $o . ; }
  timeout 300 python3 -m pytest -q -m cuda -rf --tb=short tests/test_decode_graph_tiers.py \
    tests/test_kernels_attention_cuda.py >$o/tests.log 2>&1
  rc=$?; echo "tests exit $rc"; tail -8 $o/tests.log; pack
  [ $rc = 0 ] || return
  for run in "unquantized 2048" "k_int8_v_fp8 2048" "unquantized 40960" "k_int8_v_fp8 40960"; do
    set -- $run; lat06 75 $1_$2 --max-model-len $2 --kv-codec $1; pack
  done
  for c in unquantized k_int8_v_fp8; do
    timeout 90 $N bench throughput $Q06 --max-model-len 2048 --kv-codec $c \
      --json $o/throughput_qwen3_0.6b_$c.json >$o/throughput_$c.log 2>&1
    echo "throughput $c exit $?"; tail -2 $o/throughput_$c.log | cut -c1-160; pack
  done
  # last, the first to drop: batch 1 at ~2K context, where bf16's floor went from 8 to 16 splits (unmeasured)
  for c in unquantized k_int8_v_fp8; do
    lat06 60 ${c}_1920 --max-model-len 4096 --prompt-len 1920 --kv-codec $c; pack
  done ;;
s17b)  # session 17 (~250 s on a warm machine): the few-program one-tile split floor (4dc65b6) against the rule before it,
  # same call: batch-1 TPOT with the floor (as shipped) and without (batch_choice passing decode=False, edited in place
  # for the run and restored), bf16 and k_int8_v_fp8, 128 tokens at max_model_len 2,048 and 1,920 at 4,096
  floor_ab s17b "unquantized 128 2048" "k_int8_v_fp8 128 2048" "unquantized 1920 4096" "k_int8_v_fp8 1920 4096" ;;
s17c)  # session 17: the same where the floor changes the graphs' splits past the 256 tier (max_model_len 2,048: bf16
  # 16 splits for 257-2,048 keys instead of 4 / 8, the codec's 4-warp tile 32 instead of 8 at 257-1,024)
  floor_ab s17c "unquantized 768 2048" "k_int8_v_fp8 768 2048" "unquantized 1792 2048" ;;
s17e)  # session 17's last call (~210 s): Python GC pauses in the Nano-vLLM `bench throughput` pass (session 16's one
  # ~250 ms host stall per pass), bf16 as is and with the heap frozen after the engine is built, then the codec. Ran at
  # 2c6aadc; from 85d642c on "as is" means generate()'s own frozen heap (and --freeze adds the startup collection)
  o=/tmp/s17e; mkdir -p $o; pack() { tar -czf "$out/s17e.tgz" -C $o . ; }
  for run in "unquantized no" "unquantized yes" "k_int8_v_fp8 yes" "k_int8_v_fp8 no"; do
    set -- $run; tag=$1_freeze_$2; freeze=; [ $2 = yes ] && freeze=--freeze
    timeout 75 python3 -m benchmarks.gc_pauses $o/gc_$tag.json $freeze -- bench throughput $Q06 --max-model-len 2048 \
      --kv-codec $1 --json $o/throughput_$tag.json >$o/throughput_$tag.log 2>&1
    echo "throughput $run exit $?"; grep -a "gc_pauses\|^dummy" $o/throughput_$tag.log | cut -c1-200; pack
  done ;;
s18a)  # queued (~400 s on a fresh machine): the shipped frozen heap (nanocore/engine/heap.py, 85d642c) against none,
  # same call: the Nano-vLLM `bench throughput` under benchmarks.gc_pauses, bf16 and k_int8_v_fp8, "unfrozen" edits
  # frozen_heap to never freeze (restored after); each codec's first run (cold_frozen) pays the compiles (limit 150 s)
  o=/tmp/s18a; mkdir -p $o; pack() { tar -czf "$out/s18a.tgz" -C $o . ; }
  local f=nanocore/engine/heap.py; cp $f /tmp/heap.py.orig
  for c in unquantized k_int8_v_fp8; do for mode in cold_frozen unfrozen frozen; do
    cp /tmp/heap.py.orig $f
    [ $mode = unfrozen ] && sed -i 's/_froze = gc.isenabled() and not gc.get_freeze_count()/_froze = False/' $f
    tag=${c}_$mode
    timeout 150 python3 -m benchmarks.gc_pauses $o/gc_$tag.json -- bench throughput $Q06 --max-model-len 2048 \
      --kv-codec $c --json $o/throughput_$tag.json >$o/throughput_$tag.log 2>&1
    echo "throughput $c $mode exit $? ($(grep -c '_froze = False' $f) edits)"; grep -a "gc_pauses\|^dummy" $o/throughput_$tag.log | cut -c1-200
    pack
  done; done
  cp /tmp/heap.py.orig $f ;;
*) echo "unknown section $1" ;;
esac
}
