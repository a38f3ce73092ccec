#!/usr/bin/env bash
# Issue 17 on one CUDA machine: the speculative decoding GPU tests (CUDA graphs with k + 1-token queries, the
# Triton accept kernel), then the replay benchmark (BENCHMARK-ONLY proposer) on llama-3.1-8b dummy weights.
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
