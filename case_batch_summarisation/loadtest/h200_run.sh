#!/usr/bin/env bash
# The fix on one H200 (no network), in one device call: installs the request/response models' packages
# (fastapi, pydantic, their opentelemetry-api and typing-extensions) from a wheel folder if they are missing, records the GPU, runs offline_run.py on
# llama-3.1-8b shapes with dummy weights, the brief's ticket distribution and SmolLM2's tokenizer (its chat
# template renders the tickets; prompts are real BPE token ids), sized to fit TIME_BUDGET_S, with the roofline.
#   GIT_COMMIT=<sha> WHEELS=.wheels_h200 TOKENIZER=h200_tokenizer TIME_BUDGET_S=120 \
#       case_batch_summarisation/loadtest/h200_run.sh OUTDIR
# Results: OUTDIR/offline_h200.json (+ nvidia_smi.txt); copy to case_batch_summarisation/the_fix/.
set -euo pipefail
OUT=${1:?usage: h200_run.sh OUTDIR [offline_run.py args]}
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=true
PY=${PYTHON:-python3}
if ! $PY -c "import fastapi, pydantic, yaml" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site "${WHEELS:-.wheels_h200}"/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
$PY -c "import shared_engine.entrypoints.batch.run_batch"  # fail in seconds if a package is missing
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
$PY case_batch_summarisation/loadtest/offline_run.py --model llama-3.1-8b --load-format dummy \
  --tokenizer "${TOKENIZER:?a tokenizer directory with a chat template}" --fixed-output \
  --num-tickets "${NUM_TICKETS:-20000}" --warmup-tickets "${WARMUP_TICKETS:-400}" \
  --time-budget-s "${TIME_BUDGET_S:-120}" --roofline --out "$OUT/offline_h200.json" "$@"
