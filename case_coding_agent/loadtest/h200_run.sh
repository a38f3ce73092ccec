#!/usr/bin/env bash
# The case at the brief's scale on H200s (llama-3.1-8b preset with dummy weights, the h200 trace's synthetic
# token ids): one variant per call (each ~6 minutes: the trace's ~4 minutes of sessions plus the server's
# start), so a run fits the device's 10-minute limit. Installs the server's packages from a wheel folder when
# they are missing (no network there).
#   GIT_COMMIT=<sha> WHEELS=.whl case_coding_agent/loadtest/h200_run.sh OUTDIR first_attempt [run_case args]
#   GIT_COMMIT=<sha> WHEELS=.whl case_coding_agent/loadtest/h200_run.sh OUTDIR the_fix [run_case args]
# REPLICAS (default: 2 where two GPUs are visible, else 1): 2 replicas, one per GPU, behind nginx (needs
# `nginx` installed: apt-get install nginx), as the compose file deploys; 1 replica on one GPU, every session
# on it (the brief's "8-16 sessions on one H200"), no router.
# DEADLINE_S (default 400): the replay stops that many seconds after it starts and the results file records the
# turns that finished ("complete": false), so a run that cannot finish the trace still leaves its figures inside
# the device's 10-minute limit. At cae0e36 the first attempt on one H100 (a 444,848-token pool, half the H200's)
# did not finish the trace inside the call's `timeout 560` and left only its server log
# (benchmarks/results/coding_agent_first_attempt_h100_cae0e36_cut.server0.log).
# Results: OUTDIR/<variant>_results_h200.json and the server's log; copy them to
# case_coding_agent/<variant>/results_h200.json, then run report.py.
set -euo pipefail
OUT=${1:?usage: h200_run.sh OUTDIR VARIANT [run_case args]}
VARIANT=${2:?usage: h200_run.sh OUTDIR VARIANT [run_case args]}
shift 2
. scripts/gpu_server_env.sh  # PY, PYTHONPATH, the server's wheels, nvidia_smi.txt
GPUS=$(nvidia-smi -L | wc -l)
REPLICAS=${REPLICAS:-$(( GPUS >= 2 ? 2 : 1 ))}
$PY -m case_coding_agent.loadtest.run_case --profile h200 --variant "$VARIANT" --synthetic-prompts --gpus \
  --replicas "$REPLICAS" --deadline-s "${DEADLINE_S:-400}" --out "$OUT/${VARIANT}_results_h200.json" "$@"
