#!/usr/bin/env bash
# Issue 21 on one CUDA machine (decode at small batch / long context, KV offload), results to OUTDIR:
#   1. decode attention kernel tests on CUDA (real shapes in bf16, CUDA graph replay of both merge paths,
#      50 back-to-back fused launches at 16k; the split heuristic);
#   1b. scripts/decode_fused_repro.py: the fused merge at the bench's shapes, eager / graph / the bench's
#      timing pattern with and without a sync / two streams, each step in its own process (SANITIZE=1: a
#      failing step again under compute-sanitizer memcheck);
#   2. scripts/bench_decode_long.py: batch 1/2/4 x 16k-128k in CUDA graphs, the two-kernel path (6e21304)
#      vs the fused merge (one launch) and the other variants (interleaved tiles, min_split_tokens, 2-D
#      merge, programmatic dependent launch) in the same run, each in its own process, % of copy bandwidth
#      (target >= 70%), output checks, diagnostics;
#   3. scripts/bench_kv_offload.py: 2,048 llama-3.1-8b blocks (4 GiB) GPU -> pinned host -> GPU through the
#      offloader's side stream, GB/s each way (the capacity model assumes 50), bit-identical check;
#   4. tests/engine/test_kv_offload.py on CUDA (bf16, CUDA graphs, async scheduling): restored KV bit-identical,
#      greedy output equal to a GPU prefix hit, counters.
# Each step has its own time limit. Estimate on one H200, cold Triton cache: ~50 + ~60 + ~150 + ~30 + ~70 s
# (SWEEP=1: step 2 also sweeps merge path x splits x reduce tile and BLOCK_N x stages x warps, about 140 s
# more; SANITIZE=1: up to 60 s more when a repro step fails; DECODE_ONLY=1: steps 1-2 only).
#   GIT_COMMIT=<sha> [SWEEP=1] [SANITIZE=1] [DECODE_ONLY=1] scripts/gpu_long_context_check.sh OUTDIR
#   (the device copy has no .git)
set -uo pipefail
OUT=${1:?usage: gpu_long_context_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
COMMIT=${GIT_COMMIT:-unknown}
export GIT_COMMIT=$COMMIT
step() { echo "== $1 ($(date +%T))"; }
started=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia_smi.txt"

step "decode attention kernel tests (CUDA)"
timeout 150 $PY -m pytest tests/kernels/test_paged_decode_attention.py -q -p no:cacheprovider -rs 2>&1 | tail -8 \
  | tee "$OUT/decode_kernel_tests_${COMMIT}.log"

step "fused merge repro (each step its own process)"
timeout 120 $PY scripts/decode_fused_repro.py --out "$OUT/decode_fused_repro_${COMMIT}.json" 2>&1 | cut -c 1-700 \
  | tee "$OUT/decode_fused_repro_${COMMIT}.log"

step "decode at small batch, long context (CUDA graphs)"
timeout 300 $PY scripts/bench_decode_long.py ${SWEEP:+--sweep} --out "$OUT/decode_long_h200_${COMMIT}.json" 2>&1 \
  | grep -v '^{' | tail -40 \
  | tee "$OUT/bench_decode_long_${COMMIT}.log"

if [ -n "${DECODE_ONLY:-}" ]; then echo "== done in $(( $(date +%s) - started )) s"; exit 0; fi

step "KV offload copies (llama-3.1-8b blocks, pinned host)"
timeout 90 $PY scripts/bench_kv_offload.py --out "$OUT/kv_offload_h200_${COMMIT}.json" 2>&1 | tail -6 \
  | tee "$OUT/bench_kv_offload_${COMMIT}.log"

step "KV offload through the engine (CUDA)"
timeout 150 $PY -m pytest tests/engine/test_kv_offload.py -q -p no:cacheprovider -rs 2>&1 | tail -8 \
  | tee "$OUT/kv_offload_tests_${COMMIT}.log"
echo "== done in $(( $(date +%s) - started )) s"
