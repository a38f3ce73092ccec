#!/usr/bin/env bash
# GPU check of the Triton kernels: all kernel tests on CUDA (gpu-marked bf16 real shapes and the
# CPU-shaped ones), then the benchmark. Usage: scripts/gpu_kernel_check.sh OUTDIR [extra bench args]
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu_kernel_check.sh OUTDIR [bench args]}
shift
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUTDIR/nvidia_smi.txt"
$PY -m pytest tests/kernels -q -p no:cacheprovider -rs --durations=10 -n 4 2>&1 | tee "$OUTDIR/pytest_gpu.log"
test_rc=${PIPESTATUS[0]}
$PY scripts/bench_kernels.py --out "$OUTDIR/kernels_h200.json" "$@" 2>&1 | tee "$OUTDIR/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "pytest rc=$test_rc bench rc=$bench_rc"
exit $(( test_rc != 0 || bench_rc != 0 ))
