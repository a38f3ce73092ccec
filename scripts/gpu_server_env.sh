# Sourced by the cases' H200 run scripts (case_*/loadtest/h200_run.sh): the device machine has no network, so
# the server's packages come from a wheel folder (WHEELS, default .whl; the device README says how to fill it)
# when they are missing; records the GPU in "$OUT/nvidia_smi.txt". Needs OUT set; sets PY and PYTHONPATH.
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
if ! $PY -c "import fastapi, uvicorn, prometheus_client, httpx, yaml" 2>/dev/null; then
  $PY -m pip install -q --no-index --find-links "${WHEELS:-.whl}" fastapi uvicorn prometheus-client httpx pyyaml
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
