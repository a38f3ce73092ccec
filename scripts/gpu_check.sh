#!/usr/bin/env bash
# The whole GPU check, end to end, on one CUDA machine: engine-vs-transformers correctness, the offline
# benchmarks of issue 5 (with the roofline bound and transformers' continuous batching in the same run),
# kernel tests at real shapes and the kernel benchmarks. Every results file goes to OUTDIR. Each step has
# its own time limit (seconds) so one slow step cannot starve the rest of a 10-minute lease.
#   GIT_COMMIT=$(git rev-parse HEAD) scripts/gpu_check.sh OUTDIR   (the device copy has no .git)
# Our offline runs take ENGINE_FLAGS (default --async-scheduling, the engine's CUDA default, stated;
# ENGINE_FLAGS=--no-async-scheduling runs the synchronous step).
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
ENGINE_FLAGS=${ENGINE_FLAGS---async-scheduling}
step() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia_smi.txt"

step "engine vs transformers (llama-3.1-8b dummy, 32 greedy steps)"
timeout 150 $PY scripts/gpu_correctness.py --model llama-3.1-8b --steps 32 \
  --out "$OUT/gpu_correctness_llama8b.json" 2>&1 | grep -E "^\{|Error|error" | tail -8

# max_num_seqs 448: the KV pool (~904k tokens at 0.9 utilisation) holds 452 requests of 2,000 tokens
LLAMA="--model llama-3.1-8b --load-format dummy --input-len-min 1000 --input-len-max 1000 --output-len-min 1000
  --output-len-max 1000 --max-model-len 2048 --max-num-seqs 448 --max-num-batched-tokens 8192"
step "offline llama-3.1-8b 1000 x (1000 in, 1000 out)"
timeout 240 $PY scripts/bench_offline.py $LLAMA --num-requests 1000 --hf-mode none --roofline $ENGINE_FLAGS \
  --out "$OUT/offline_llama8b_1000x1000.json" 2>&1 | grep -E "ours|roofline|wrote|Error"

if [ -z "${SKIP_TRANSFORMERS:-}" ]; then  # SKIP_TRANSFORMERS=1: keep the whole check under a 10-minute call
  step "transformers generate_batch (paged|sdpa) on the first 32 requests of the same workload"
  timeout 150 $PY scripts/bench_offline.py $LLAMA --num-requests 32 --hf-only --hf-mode generate_batch \
    --out "$OUT/offline_llama8b_transformers_subset.json" 2>&1 | grep -E "transformers|wrote|Error"
fi

step "batch-1 decode (llama-3.1-8b)"
timeout 90 $PY scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --num-requests 1 \
  --input-len-min 32 --input-len-max 32 --output-len-min 256 --output-len-max 256 --max-model-len 512 \
  --max-num-seqs 8 --hf-mode none --roofline $ENGINE_FLAGS --out "$OUT/decode_batch1_llama8b.json" 2>&1 | grep -E "ours|TPOT|wrote|Error"

step "offline qwen3-0.6b, nano-vllm workload (256 requests, lengths uniform in [100, 1024])"
timeout 100 $PY scripts/bench_offline.py --model qwen3-0.6b --load-format dummy --num-requests 256 \
  --input-len-min 100 --input-len-max 1024 --output-len-min 100 --output-len-max 1024 --max-model-len 2048 \
  --max-num-seqs 256 --hf-mode none --roofline $ENGINE_FLAGS --out "$OUT/offline_qwen3_0.6b_nanovllm.json" 2>&1 \
  | grep -E "ours|roofline|wrote|Error"

step "kernel tests (GPU)"
timeout 150 $PY -m pytest tests/kernels -q -x -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/kernel_tests.txt"
step done
