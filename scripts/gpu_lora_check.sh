#!/usr/bin/env bash
# Multi-LoRA on one CUDA machine (issue 18), every results file to OUTDIR:
#   1. LoRA kernel tests on CUDA: SGMV (16- and 64-token tiles, the fused batch-1 kernel) and BGMV against
#      their references, real llama-3.1-8b shapes in bf16; the batched slot load (one copy of the pinned
#      image, two foreach copies) equal to the per-slice writes;
#   2. LoRA under CUDA graphs (small fp32 model): greedy outputs mixing 3 adapters and the base through
#      graphs (SGMV; with 2 slots and loads on their own copy stream; BGMV with LORA_GRAPH_BGMV=1) equal the
#      eager masked torch path; base-only steps replay
#      base-only graphs (tests/engine/test_cuda_graphs.py, whose graph keys changed, is not run here);
#   3. scripts/bench_lora_kernels.py: SGMV vs BGMV per projection, and the fused one-launch SGMV
#      (kernels/lora_sgmv_fused.py sgmv_fused) at T <= 64, graph replays, T = MICRO_TOKENS (default 1 2 8 64; the
#      script's own default adds 16 240 2048); ~60-100 s (estimate, not measured; own limit 110 s);
#   4. scripts/bench_lora.py: base engine vs the LoRA engine on the base, 30 rank-16 adapters, 30 of ranks
#      8/16/64, batch-1 ITL, the CPU-cache-to-slot time for the pinned slot images and for the old pageable
#      fp32 path, each run's phases (steps, host / GPU-span seconds) (NUM_REQUESTS, default 240 as in the
#      README table);
#   5. (only with STEPS=churn, not in "all") the same benchmark with 8 GPU slots for the 30 adapters: slot
#      loads inside the timed runs (the admission waits for slots too), loads on the compute stream and then
#      on their own copy stream (--lora-slot-stream), ~130 s each;
#   6. (only with STEPS=profile, not in "all") scripts/profile_lora_step.py: where a step's time goes, base
#      engine against 30 resident rank-16 adapters on the bench's workload, CUDA graphs and eager (per-step
#      wall, device span and host pieces; torch.profiler kernels top-25 over the prefill steps and 16
#      steady-state decode steps, and at batch 1; graph vs eager steps and why). Estimate (not measured): ~115 s (two
#      llama-3.1-8b start-ups with graph capture ~25 + ~40 s, four runs of the workload ~30 s + 4 at batch 1, the adapters
#      ~5 s, none after the bench step: its rank-16 adapters are reused); own limit 240 s. STEPS="profile bench"
#      ~230 s (bench ~110 s, then profile ~115 s).
#   7. (only with STEPS=itl, not in "all") batch-1 ITL A/B of the LoRA kernel switches, base vs one rank-16
#      q/k/v/o adapter (scripts/bench_lora.py --itl-only --max-num-seqs 16: fewer graphs to capture, no
#      throughput runs): first the CUDA-graph correctness test of kernels/lora_tiny.py (llama qkv shapes,
#      bf16; limit 60 s), then one engine process per variant, each writing lora_itl_<variant>_<commit>.json:
#        sgmv         the default two SGMV kernels (shrink on the side stream in graphs), plus the base engine;
#        tiny         LORA_TINY_MAX_TOKENS=8: kernels/lora_tiny.py at T <= 8 (one launch, no tiles);
#        tiny_two     the same as two launches (LORA_TINY_TWO_LAUNCHES=1: shrinks, then expands; no counter);
#        tiny_ticket  (not in the default list) tiny with LORA_TINY_TICKET=1 (roles by atomic ticket).
#      The engine-level check of a variant is step 2 with its env, e.g. LORA_TINY_MAX_TOKENS=8 STEPS=graphs
#      (that test's decode graphs are all <= 8 tokens, so every decode runs lora_tiny; ~45 s).
#      ITL_VARIANTS picks them (default "sgmv tiny tiny_two"). Estimate (not measured): ~25 s test, ~70 s
#      sgmv (two engines), ~45 s per other variant, ~185 s in all; limits 60 + 130 + 90 per other variant.
# Each step has its own time limit, so one slow step cannot starve the next. On one H200 at c518670
# (gpu_run_c518670.log): bench 99 s, profile 80 s, so STEPS="profile bench" ~180 s. Estimates (not
# measured): kernels ~60 s cold (more Triton variants since: 64-token tiles, the fused kernel; limit 150 s),
# graphs ~45 s (three small engines), micro ~60-100 s (limit 110 s); STEPS="kernels profile bench" ~240 s, STEPS="micro bench" ~160-200 s. The two
# llama-3.1-8b engine start-ups per script (graph capture) dominate.
#   GIT_COMMIT=<sha> scripts/gpu_lora_check.sh OUTDIR      (the device copy has no .git)
# STEPS: which steps (default all; any of: kernels graphs micro bench churn profile itl; all leaves churn,
# profile and itl out), e.g.
# STEPS="kernels bench" or STEPS="bench churn" (~390 s).
set -uo pipefail
OUT=${1:?usage: gpu_lora_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
COMMIT=${GIT_COMMIT:-unknown}
STEPS=" ${STEPS:-all} "
want() { [[ "$STEPS" == *" all "* || "$STEPS" == *" $1 "* ]]; }
step() { echo "== $1 ($(date +%T))"; }
started=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia_smi.txt"

if want kernels; then
  step "LoRA kernel tests (CUDA, real shapes in bf16)"
  timeout 150 $PY -m pytest tests/kernels/test_lora_sgmv.py tests/kernels/test_lora_bgmv.py tests/kernels/test_lora_tiny.py \
    tests/lora/test_slot_writes.py \
    -q -p no:cacheprovider \
    -rs 2>&1 | tail -15 | tee "$OUT/lora_kernel_tests_${COMMIT}.log"
fi

if want graphs; then
  step "LoRA under CUDA graphs (graphs = eager torch path; base-only graphs)"
  LORA_GRAPH_STREAM=1 timeout 90 $PY -m pytest tests/lora/test_lora_cuda_graphs.py -q -p no:cacheprovider -rs 2>&1 \
    | tail -15 \
    | tee "$OUT/lora_graph_tests_${COMMIT}.log"
fi

if want micro; then
  step "SGMV vs BGMV vs fused SGMV per projection"
  # shellcheck disable=SC2086
  # the JSON is rewritten after every case (r16 first), so a run stopped by the limit keeps what it measured
  timeout 110 $PY scripts/bench_lora_kernels.py --tokens ${MICRO_TOKENS:-1 2 8 64} \
    --out "$OUT/lora_kernels_h200_${COMMIT}.json" 2>&1 | tail -16 \
    | tee "$OUT/bench_lora_kernels_${COMMIT}.log"
fi

if want bench; then
  # batch-1 ITL base vs rank-16 (itl_ms in the JSON); the two-kernel SGMV by default (c518670's path; the fused
  # kernel with LORA_FUSED_MAX_TOKENS=2, 64-token prefill tiles with LORA_PREFILL_TILE_ROWS=1024: both were
  # slower at 8ea6fb5); ~100 s
  step "bench_lora (llama-3.1-8b dummy, ${NUM_REQUESTS:-240} requests)"
  GIT_COMMIT=$COMMIT timeout 240 $PY scripts/bench_lora.py --num-requests "${NUM_REQUESTS:-240}" \
    --out "$OUT/lora_h200_llama8b_${COMMIT}.json" 2>&1 | tail -40 | tee "$OUT/bench_lora_${COMMIT}.log"
fi
if [[ "$STEPS" == *" churn "* ]]; then
  step "bench_lora with 8 slots for 30 adapters (slot loads in the timed runs)"
  GIT_COMMIT=$COMMIT timeout 240 $PY scripts/bench_lora.py --num-requests "${NUM_REQUESTS:-240}" --max-loras 8 \
    --out "$OUT/lora_h200_llama8b_slots8_${COMMIT}.json" 2>&1 | tail -40 | tee "$OUT/bench_lora_slots8_${COMMIT}.log"
  step "the same, slot loads on their own copy stream (--lora-slot-stream)"
  GIT_COMMIT=$COMMIT timeout 240 $PY scripts/bench_lora.py --num-requests "${NUM_REQUESTS:-240}" --max-loras 8 \
    --lora-slot-stream --out "$OUT/lora_h200_llama8b_slots8_stream_${COMMIT}.json" 2>&1 | tail -40 \
    | tee "$OUT/bench_lora_slots8_stream_${COMMIT}.log"
fi
if [[ "$STEPS" == *" profile "* ]]; then
  step "profile_lora_step (base vs 30 rank-16 adapters, graphs and eager)"
  GIT_COMMIT=$COMMIT timeout 240 $PY scripts/profile_lora_step.py --num-requests "${NUM_REQUESTS:-240}" \
    --out "$OUT/profile_lora_step_h200_${COMMIT}.json" 2>&1 | grep -v "^USDT\|SyncActivityProfiler" | tail -12 \
    | tee "$OUT/profile_lora_step_${COMMIT}.log"
fi
if [[ "$STEPS" == *" itl "* ]]; then
  step "lora_tiny under CUDA graphs (llama-3.1-8b qkv, bf16)"
  timeout 60 $PY -m pytest tests/kernels/test_lora_tiny.py -k cuda_graph -q -p no:cacheprovider -rs 2>&1 | tail -8 \
    | tee "$OUT/lora_tiny_graph_tests_${COMMIT}.log"
  for variant in ${ITL_VARIANTS:-sgmv tiny tiny_two}; do
    case $variant in
      sgmv) envs=(); extra=(); limit=130 ;;
      tiny) envs=(LORA_TINY_MAX_TOKENS=8); extra=(--skip-base); limit=90 ;;
      tiny_two) envs=(LORA_TINY_MAX_TOKENS=8 LORA_TINY_TWO_LAUNCHES=1); extra=(--skip-base); limit=90 ;;
      tiny_ticket) envs=(LORA_TINY_MAX_TOKENS=8 LORA_TINY_TICKET=1); extra=(--skip-base); limit=90 ;;
      *) echo "unknown ITL variant $variant"; continue ;;
    esac
    step "batch-1 ITL: $variant (${envs[*]:-defaults})"
    env ${envs[@]+"${envs[@]}"} GIT_COMMIT=$COMMIT timeout $limit $PY scripts/bench_lora.py --itl-only ${extra[@]+"${extra[@]}"} \
      --max-num-seqs 16 --out "$OUT/lora_itl_${variant}_${COMMIT}.json" 2>&1 | tail -3 \
      | tee "$OUT/bench_lora_itl_${variant}_${COMMIT}.log"
  done
fi
echo "== done in $(( $(date +%s) - started )) s"
