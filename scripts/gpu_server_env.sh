# Sourced by the cases' H200 run scripts (case_*/loadtest/h200_run.sh): the device machine has no network, so
# the server's packages come from a wheel folder (WHEELS, default .whl; the device README says how to fill it:
# fastapi, starlette, uvicorn, pydantic, pydantic-core, typing-inspection, annotated-types, annotated-doc and
# opentelemetry-api for Python 3.12, manylinux x86_64)
# when they are missing; records the GPU in "$OUT/nvidia_smi.txt". Needs OUT set; sets PY and PYTHONPATH.
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
if ! $PY -c "import fastapi, uvicorn, prometheus_client, httpx, yaml" 2>/dev/null; then
  # --no-deps: the folder holds the missing packages themselves (fastapi 0.165 also requires opentelemetry-api;
  # its typing-extensions, prometheus-client, httpx and PyYAML are on the device); resolving their dependencies
  # failed the whole install at cae0e36 over the one wheel the folder lacked
  $PY -m pip install -q --no-index --no-deps "${WHEELS:-.whl}"/*.whl
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
