#!/usr/bin/env bash
# Issue 17 on one CUDA machine: the speculative decoding GPU tests (CUDA graphs with k + 1-token queries, the
# Triton accept kernel, the draft_model method), then the replay benchmark (BENCHMARK-ONLY proposer) on
# llama-3.1-8b dummy weights, and (step "draft") the same batch-1 replay paying for a llama-3.2-1b draft model.
#   GIT_COMMIT=$(git rev-parse HEAD) scripts/gpu_spec_check.sh OUTDIR   (STEPS="tests bench" by default)
set -uo pipefail
OUT=${1:?usage: gpu_spec_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
STEPS=" ${STEPS:-tests bench} "
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
if [[ "$STEPS" == *" tests "* ]]; then
  echo "== GPU tests ($(date +%T))"
  timeout ${TEST_TIMEOUT:-110} $PY -m pytest -q -x -p no:cacheprovider tests/kernels/test_rejection_sampling.py \
    tests/engine/test_spec_decode_cuda.py 2>&1 | tail -15 | tee "$OUT/spec_gpu_tests.txt"
fi
if [[ "$STEPS" == *" bench "* ]]; then
  echo "== replay benchmark ($(date +%T))"
  timeout ${BENCH_TIMEOUT:-170} $PY scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b \
    --load-format dummy --input-len 1000 --output-len ${OUTPUT_LEN:-128} --batch-sizes ${BATCH_SIZES:-64 256 448} \
    --out "$OUT/spec_decode_h200_replay.json" 2>&1 | grep -vE "^\s*$" | tail -30 | tee "$OUT/bench_log.txt"
fi
if [[ "$STEPS" == *" draft "* ]]; then
  echo "== replay benchmark with the llama-3.2-1b draft model's cost ($(date +%T))"
  timeout ${DRAFT_TIMEOUT:-110} $PY scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b \
    --load-format dummy --draft-model llama-3.2-1b --input-len 1000 --output-len ${OUTPUT_LEN:-128} \
    --batch-sizes 0 --out "$OUT/spec_decode_h200_draft_cost.json" 2>&1 | grep -vE "^\s*$" | tail -20 \
    | tee "$OUT/draft_cost_log.txt"
fi
