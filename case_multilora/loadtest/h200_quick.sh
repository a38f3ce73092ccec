#!/usr/bin/env bash
# The case on one H200 in one device call of about 6 minutes (h200_run.sh is the ~25-minute version):
#   GIT_COMMIT=<sha> WHEELS=.wheels_h200 TOKENIZER=h200_tokenizer bash case_multilora/loadtest/h200_quick.sh OUTDIR
# carry: .wheels_h200 (fastapi, pydantic(+core), starlette, annotated-types, typing-inspection,
# typing-extensions, opentelemetry-api AND uvicorn, limits, deprecated: the engine's and the gateway's HTTP
# stack; the device has httpx, click, h11, wrapt, packaging) and h200_tokenizer (SmolLM2's tokenizer files).
# Optional in WHEELS: uvloop and httptools (cp312 manylinux): uvicorn then runs both servers on them instead of
# asyncio's loop and h11, about a quarter less CPU per SSE chunk (loadtest/http_path_bench.json); the results'
# `http_stack` says which ran.
# 1. packages from WHEELS if missing, then every import the run needs (fails in seconds, before any GPU work);
# 2. 30 random adapters of ranks 8/16/64 (10 each, q/k/v/o, bf16) with llama-3.1-8b's shapes (~15 s);
# 3. SmolLM2's tokenizer widened to llama-3.1-8b's 128,256 ids (wide_tokenizer.py: every sampled id is text);
# 4. h200_quick.py: the fix's engine (~45 s start), warm-up 10 s, isolated 60 s, the fix 60 s; the first
#    attempt's engine (~45 s), warm-up 10 s, first attempt 60 s (TIME_BUDGET_S stops it at 480 s whatever);
# 5. report.py --profile h200q (summary + plot). Results: OUTDIR/case_multilora/{the_fix,first_attempt}/
#    *_h200q.json, OUTDIR/case_multilora/loadtest/summary_h200q.json, OUTDIR/case_multilora/plots/ttft_h200q.png,
#    OUTDIR/nvidia_smi.txt, OUTDIR/logs/ (engine and gateway logs, samples). Copy OUTDIR/case_multilora/
#    over the repo's case_multilora/.
set -euo pipefail
OUT=${1:?usage: h200_quick.sh OUTDIR}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=false
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PY=${PYTHON:-python3}
NEEDED="fastapi, pydantic, starlette, uvicorn, limits, httpx, yaml, numpy, safetensors, prometheus_client, matplotlib"
if ! $PY -c "import $NEEDED" 2>/dev/null; then
  if ls "${WHEELS:-.wheels_h200}"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "${SITE:-/tmp/site}" "${WHEELS:-.wheels_h200}"/*.whl
    export PYTHONPATH="$PYTHONPATH:${SITE:-/tmp/site}"
  fi
fi
$PY - <<EOF || { echo "h200_quick.sh: a package is missing (WHEELS=${WHEELS:-.wheels_h200} needs uvicorn, limits, deprecated too)"; exit 3; }
import $NEEDED
import case_multilora.app.server, case_multilora.loadtest.h200_quick, shared_engine.entrypoints.openai.api_server
EOF
test -f "${TOKENIZER:-h200_tokenizer}/tokenizer.json" || { echo "no ${TOKENIZER:-h200_tokenizer}/tokenizer.json"; exit 3; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia_smi.txt" || true
ADAPTERS=${ADAPTERS:-/tmp/multilora_adapters}
WIDE=/tmp/multilora_wide_tokenizer
MODEL_ARGS=()
if [ -n "${MODEL:-}" ]; then MODEL_ARGS=(--model "$MODEL" --dtype "${DTYPE:-auto}"); fi  # CPU smoke only
t0=$(date +%s)
$PY scripts/make_adapters.py random --model "${MODEL:-llama-3.1-8b}" --ranks 8 16 64 --count 10 --out "$ADAPTERS"
$PY case_multilora/loadtest/wide_tokenizer.py "${TOKENIZER:-h200_tokenizer}" "$WIDE" \
  --vocab-size "$($PY -c "from shared_engine.model_loader.model_source import resolve_model as r; \
print(r('${MODEL:-llama-3.1-8b}', 'dummy', None).arch.vocab_size)")"
echo "adapters + tokenizer: $(( $(date +%s) - t0 )) s"
mkdir -p "$OUT/case_multilora/the_fix" "$OUT/case_multilora/first_attempt" "$OUT/case_multilora/loadtest" "$OUT/logs"
rc=0
timeout --signal=INT --kill-after=20 "${TIME_BUDGET_S:-480}" \
  $PY case_multilora/loadtest/h200_quick.py --adapters-dir "$ADAPTERS" --tokenizer "$WIDE" \
  --out-dir "$OUT/case_multilora" --work-dir "$OUT/logs" "${MODEL_ARGS[@]}" ${QUICK_ARGS:-} || rc=$?
echo "h200_quick.py exit $rc after $(( $(date +%s) - t0 )) s"
$PY case_multilora/loadtest/report.py --profile h200q --case-dir "$OUT/case_multilora" --plots "$OUT/case_multilora/plots" \
  --summary "$OUT/case_multilora/loadtest/summary_h200q.json" | tail -n 40 || true
find "$OUT/logs" -name "*.log" -size +2M -exec truncate -s 2M {} \;
exit $rc
