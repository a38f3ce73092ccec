#!/usr/bin/env bash
# The whole GPU check, end to end, on one CUDA machine: kernel tests at real shapes, engine-vs-transformers
# correctness, kernel benchmarks, and the offline benchmarks of issue 5. Every results file goes to OUTDIR.
#   scripts/gpu_check.sh OUTDIR [quick]
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR [quick]}
MODE=${2:-full}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
step() { echo "== $1 ($(date +%T))"; }

step "kernel tests (GPU, bf16, real shapes)"
$PY -m pytest tests/kernels -q -x -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/kernel_tests.txt"

step "engine vs transformers (llama-3.1-8b dummy, 32 greedy steps)"
$PY scripts/gpu_correctness.py --model llama-3.1-8b --steps 32 --out "$OUT/gpu_correctness_llama8b.json" 2>&1 | tail -6

step "batch-1 decode (llama-3.1-8b)"
$PY scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --num-requests 1 --input-len-min 32 \
  --input-len-max 32 --output-len-min 256 --output-len-max 256 --max-model-len 512 --max-num-seqs 8 \
  --hf-mode none --out "$OUT/decode_batch1_llama8b.json" 2>&1 | grep -E "ours|wrote"

step "offline llama-3.1-8b 1000 x (1000 in, 1000 out), transformers generate_batch on a subset"
N=1000; [ "$MODE" = quick ] && N=200
$PY scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --num-requests $N --input-len-min 1000 \
  --input-len-max 1000 --output-len-min 1000 --output-len-max 1000 --max-model-len 2048 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --hf-mode generate_batch --hf-num-requests 64 --roofline \
  --out "$OUT/offline_llama8b_1000x1000.json" 2>&1 | grep -E "ours|roofline|transformers|speed|wrote|Error"

step "offline qwen3-0.6b, nano-vllm workload (256 requests, lengths uniform in [100, 1024])"
$PY scripts/bench_offline.py --model qwen3-0.6b --load-format dummy --num-requests 256 --input-len-min 100 \
  --input-len-max 1024 --output-len-min 100 --output-len-max 1024 --max-model-len 2048 --max-num-seqs 256 \
  --hf-mode none --roofline --out "$OUT/offline_qwen3_0.6b_nanovllm.json" 2>&1 | grep -E "ours|roofline|wrote|Error"

step "kernel benchmarks"
$PY scripts/bench_kernels.py --out "$OUT/kernels_h200.json" 2>&1 | tail -12
step done
