#!/usr/bin/env bash
# The case's runs on one H200 (no network): installs the server's packages from a wheel folder if they are
# missing, records the GPU, and runs one variant at the brief's scale (one variant per call keeps each call
# under the device's 10-minute limit: about 6 minutes each; a 3-point sweep with 90 s windows about 8).
#   GIT_COMMIT=$(git rev-parse HEAD) (taken here, recorded over any stale .git on the device), then
#   GIT_COMMIT=<sha> WHEELS=.whl case_rag_chatbot/loadtest/h200_run.sh OUTDIR first_attempt
#   GIT_COMMIT=<sha> WHEELS=.whl case_rag_chatbot/loadtest/h200_run.sh OUTDIR the_fix
#   GIT_COMMIT=<sha> WHEELS=.whl case_rag_chatbot/loadtest/h200_run.sh OUTDIR the_fix \
#       --sweep-users 200,250,300 --warmup-s 30 --duration-s 90 --drain-s 20
# Results: OUTDIR/<variant>_results_h200.json (a sweep: <variant>_sweep_h200.json) and the server's log;
# copy them to case_rag_chatbot/<variant>/results_h200.json (sweep_h200.json), then run report.py.
set -euo pipefail
OUT=${1:?usage: h200_run.sh OUTDIR VARIANT [run_case.py args]}
VARIANT=${2:?usage: h200_run.sh OUTDIR VARIANT [run_case.py args]}
shift 2
. scripts/gpu_server_env.sh  # PY, PYTHONPATH, the server's wheels, nvidia_smi.txt
KIND=results
case " $* " in *" --sweep-users "*) KIND=sweep;; esac
$PY case_rag_chatbot/loadtest/run_case.py --profile h200 --variant "$VARIANT" --drain-s 30 \
  --out "$OUT/${VARIANT}_${KIND}_h200.json" "$@"
