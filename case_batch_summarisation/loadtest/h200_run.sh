#!/usr/bin/env bash
# The fix on one H200 (no network), in one 10-minute device call: installs the request/response models'
# packages (fastapi, pydantic, their opentelemetry-api and typing-extensions) from a wheel folder if they are
# missing, records the GPU, runs offline_run.py on llama-3.1-8b shapes with dummy weights, the brief's ticket
# distribution (log-normal, median 600 tokens, sigma 0.7, cut at 6,000) and SmolLM2's tokenizer (its chat
# template renders the tickets; prompts are real BPE token ids): NUM_TICKETS (20,000) tickets queued at once
# (never sized down), a small warm-up first, the roofline after.
#   GIT_COMMIT=<sha> case_batch_summarisation/loadtest/h200_run.sh OUTDIR
# Expected, from 4dec0d0's H200 run (start-up 38 s, 37.2 tickets/s on 2,728 tickets, prepare 1.3 s): ~10 s
# packages and imports, ~40 s engine start (the night's 20,000 rows written meanwhile), ~5 s warm-up and
# ceilings, ~9 s preparing the rows, then 20,000 / 37-40 tickets/s = 500-540 s: ~565-605 s in all, at the
# edge of one 10-minute call. RUN_LIMIT_S (585) bounds the python process: past it, SIGTERM writes the
# results with `partial_run` (tickets finished, rate) and the script exits 124.
# GPUS=2 (kind nvidia-h200-x2): two workers, 10,000 tickets each queued at once on its own H200, both
# together (~55 s start-up and preparing + 250-270 s: ~330 s); files offline_h200_<commit>_gpu<i>.json.
# Carry the untracked .wheels_h200 and h200_tokenizer (WHEELS, TOKENIZER to name others).
# Results: OUTDIR/offline_h200_<commit>[_gpu<i>].json, .log and nvidia_smi.txt; commit them to
# case_batch_summarisation/the_fix/, then `python -m case_batch_summarisation.loadtest.h200_row FILE...`.
set -euo pipefail
OUT=${1:?usage: h200_run.sh OUTDIR [offline_run.py args]}
shift
mkdir -p "$OUT"
export TQDM_MININTERVAL=${TQDM_MININTERVAL:-10} PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=true
PY=${PYTHON:-python3}
TOK=${TOKENIZER:-h200_tokenizer}
SHA=${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
test -f "$TOK/tokenizer.json" -a -f "$TOK/chat_template.jinja" || { echo "no tokenizer in $TOK" >&2; exit 2; }
if ! $PY -c "import fastapi, pydantic, yaml" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site "${WHEELS:-.wheels_h200}"/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
$PY -c "import shared_engine.entrypoints.batch.run_batch, tqdm"  # fail in seconds if a package is missing
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
fi
export GIT_COMMIT=$SHA
run() {  # run OUTFILE [offline_run.py args]: one engine, under the time limit, its log beside its results
  local out=$1; shift
  timeout -s TERM -k 10 "${RUN_LIMIT_S:-585}" \
    $PY case_batch_summarisation/loadtest/offline_run.py --model "${MODEL:-llama-3.1-8b}" --load-format dummy \
    --tokenizer "$TOK" --fixed-output --warmup-tickets "${WARMUP_TICKETS:-64}" --roofline --out "$out.json" "$@" \
    > "$out.log" 2>&1
}
GPUS=${GPUS:-1}
N=${NUM_TICKETS:-20000}
if [ "$GPUS" = 1 ]; then
  rc=0; run "$OUT/offline_h200_${SHA:0:7}" --num-tickets "$N" "$@" || rc=$?
  tail -c 2000 "$OUT/offline_h200_${SHA:0:7}.log"; exit $rc
fi
# GPUS=k (nvidia-h200-x2 and up): k workers, one GPU each, the night's tickets split in k slices (other
# tickets each), every slice queued at once on its engine, all k running together.
pids=()
for ((i = 0; i < GPUS; i++)); do
  CUDA_VISIBLE_DEVICES=$i run "$OUT/offline_h200_${SHA:0:7}_gpu$i" --num-tickets $((N / GPUS)) \
    --first-ticket $((i * N / GPUS)) "$@" &
  pids+=($!)
done
rc=0
for ((i = 0; i < GPUS; i++)); do
  wait "${pids[$i]}" || rc=$?
  echo "== GPU $i"; tail -c 1200 "$OUT/offline_h200_${SHA:0:7}_gpu$i.log"
done
exit $rc
