#!/usr/bin/env bash
# The whole GPU check, end to end, on one CUDA machine: engine-vs-transformers correctness, the offline
# benchmarks of issue 5 (with the roofline bound, and transformers' continuous batching in the same process
# and results file as the llama-3.1-8b run), kernel tests at real shapes. Every results file goes to OUTDIR.
# Each step has its own time limit (seconds) so one slow step cannot starve the rest.
#   GIT_COMMIT=$(git rev-parse HEAD) scripts/gpu_check.sh OUTDIR   (the device copy has no .git)
# STEPS: which steps to run (default all; any of: correctness llama batch1 qwen kernels). All of them take
# about 9 minutes on one H200; a 10-minute call is safer split, e.g. STEPS="llama" then
# STEPS="correctness batch1 qwen kernels".
# SKIP_TRANSFORMERS=1: the llama step without the transformers baseline (~2.5 minutes shorter).
# ENGINE_FLAGS: our engine's flags (default --async-scheduling, the engine's CUDA default, stated;
# ENGINE_FLAGS=--no-async-scheduling runs the synchronous step).
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
ENGINE_FLAGS=${ENGINE_FLAGS---async-scheduling}
STEPS=" ${STEPS:-all} "
want() { [[ "$STEPS" == *" all "* || "$STEPS" == *" $1 "* ]]; }
step() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia_smi.txt"

if want correctness; then
  step "engine vs transformers (llama-3.1-8b dummy, 32 greedy steps)"
  timeout 150 $PY scripts/gpu_correctness.py --model llama-3.1-8b --steps 32 \
    --out "$OUT/gpu_correctness_llama8b.json" 2>&1 | grep -E "^\{|Error|error" | tail -8
fi

if want llama; then
  # max_num_seqs 448: the KV pool (~904k tokens at 0.9 utilisation) holds 452 requests of 2,000 tokens.
  # transformers generate_batch on the first 24 requests: ~135 s on the H200 (5b21e0d; 32 ran past 150 s).
  HF="--hf-mode generate_batch --hf-num-requests 24"
  [ -n "${SKIP_TRANSFORMERS:-}" ] && HF="--hf-mode none"
  step "offline llama-3.1-8b 1000 x (1000 in, 1000 out), then transformers ($HF)"
  timeout 420 $PY scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --input-len-min 1000 \
    --input-len-max 1000 --output-len-min 1000 --output-len-max 1000 --max-model-len 2048 --max-num-seqs 448 \
    --max-num-batched-tokens 8192 --num-requests 1000 $HF --roofline $ENGINE_FLAGS \
    --out "$OUT/offline_llama8b_1000x1000.json" 2>&1 | grep -E "ours|roofline|transformers|speed-up|wrote|Error"
fi

if want batch1; then
  step "batch-1 decode (llama-3.1-8b)"
  timeout 90 $PY scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --num-requests 1 \
    --input-len-min 32 --input-len-max 32 --output-len-min 256 --output-len-max 256 --max-model-len 512 \
    --max-num-seqs 8 --hf-mode none --roofline $ENGINE_FLAGS --out "$OUT/decode_batch1_llama8b.json" 2>&1 \
    | grep -E "ours|TPOT|wrote|Error"
fi

if want qwen; then
  step "offline qwen3-0.6b, nano-vllm workload (256 requests, lengths uniform in [100, 1024])"
  timeout 100 $PY scripts/bench_offline.py --model qwen3-0.6b --load-format dummy --num-requests 256 \
    --input-len-min 100 --input-len-max 1024 --output-len-min 100 --output-len-max 1024 --max-model-len 2048 \
    --max-num-seqs 256 --hf-mode none --roofline $ENGINE_FLAGS --out "$OUT/offline_qwen3_0.6b_nanovllm.json" \
    2>&1 | grep -E "ours|roofline|wrote|Error"
fi

if want kernels; then
  step "kernel tests (GPU)"
  timeout 150 $PY -m pytest tests/kernels -q -x -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/kernel_tests.txt"
fi
step done
