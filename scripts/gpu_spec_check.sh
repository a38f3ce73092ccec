#!/usr/bin/env bash
# Issue 17 on one CUDA machine: the speculative decoding GPU tests (CUDA graphs with k + 1-token queries, the
# Triton accept kernel, the draft_model method), then the replay benchmark (BENCHMARK-ONLY proposer, with
# BENCHMARK-ONLY forced acceptance: verification accepts exactly the drafts the replay marks right, since dummy
# bf16 logits reject the recording) on llama-3.1-8b dummy weights: batch 1 at acceptance 0.6 / 0.8 and batch
# 64 / 256 / 448 at 0.8, k 3 and 5, policy always and auto, vs speculation off; and (step "draft") the batch-1
# replay paying for a llama-3.2-1b draft model's forwards and KV mirror.
#   GIT_COMMIT=<sha> STEPS="bench draft" scripts/gpu_spec_check.sh OUTDIR   (STEPS="tests bench" by default)
# Batch-1 figures come from BATCH1_PROMPTS requests (3 by default), each alone in turn (one 128-token request has
# only ~40 speculative steps); every run also records per-step host phases, GPU span, graph vs eager steps and
# (draft) the proposal and mirror GPU time. SPEC_FUSED_PROPOSAL=0: the draft model proposes step by step.
# Expected on one H200: tests ~70 s (limit 110 s); bench ~140 s (limit 190 s); draft ~55 s (limit 100 s).
# STEPS="bench draft" is ~195 s, at most ~290 s with both limits hit; a run cut by its limit keeps the batches
# it finished.
# STEPS=bench1000 (issue 17's 1,000 / 1,000 workload, run alone: GIT_COMMIT=<sha> STEPS=bench1000 ...): batch 64,
# 256 and 448, 1000-token prompts and outputs, speculation off and policy auto at k 3 and 5 only (acceptance
# 0.8), the timed off run doubling as the replay's recording, gpu_memory_utilization 0.95 (448 x 2000 tokens of
# KV: ~117 GB); per batch, 32-token off + always calibration runs (and batch 1's once) whose step costs give the
# simulator's predicted ratio per k before the auto runs (each run: predicted_throughput_ratio,
# prediction_relative_error). Expected from 9a99c62's off throughputs (8.6k / 14.7k / 13.5k tok/s): 3 full runs
# per batch x (7.4 + 17.4 + 33.2 s) = 174 s, + cold prefills ~20 s, + load and warm-up ~45 s, + calibration and
# prediction ~15 s: ~255 s; up to ~300 s if the 1000-2000-token contexts slow decode steps by ~25% (limit 360 s,
# BENCH1000_TIMEOUT; batches saved as they finish).
# STEPS=agent (issue 21's speculation figures at the coding-agent case's shapes): AGENT_INPUT_LEN-token prompts
# (16,000 by default), 256-token outputs, batch 4 and 32, k 8, the replay proposer at acceptance 0.69 (suffix
# drafting's rate in the case's CPU run), speculation off vs policy auto; ~150-240 s on one H200.
set -uo pipefail
OUT=${1:?usage: gpu_spec_check.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
STEPS=" ${STEPS:-tests bench} "
C=${GIT_COMMIT:-unknown}
. scripts/gpu_card.sh  # CARD: results files name the card they ran on
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
if [[ "$STEPS" == *" tests "* ]]; then
  echo "== GPU tests ($(date +%T))"
  timeout ${TEST_TIMEOUT:-110} $PY -m pytest -q -x -p no:cacheprovider tests/kernels/test_rejection_sampling.py \
    tests/engine/test_spec_decode_cuda.py 2>&1 | tail -15 | tee "$OUT/spec_gpu_tests_${CARD}_$C.txt"
fi
if [[ "$STEPS" == *" bench "* ]]; then
  echo "== replay benchmark, forced acceptance ($(date +%T))"
  timeout ${BENCH_TIMEOUT:-190} $PY scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b \
    --load-format dummy --input-len 1000 --output-len ${OUTPUT_LEN:-128} --batch-sizes ${BATCH_SIZES:-64 256 448} \
    --ks 3 5 --acceptance 0.6 0.8 --throughput-acceptance 0.8 --batch1-prompts ${BATCH1_PROMPTS:-3} \
    --out "$OUT/spec_decode_${CARD}_replay_$C.json" 2>&1 | grep -vE "^\s*$" | tee "$OUT/spec_bench_log_$C.txt" \
    | grep -E "^batch |wrote|Error|error" | tail -12
fi
if [[ "$STEPS" == *" draft "* ]]; then
  echo "== replay benchmark, forced acceptance, with the llama-3.2-1b draft model's cost ($(date +%T))"
  timeout ${DRAFT_TIMEOUT:-100} $PY scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b \
    --load-format dummy --draft-model llama-3.2-1b --input-len 1000 --output-len ${OUTPUT_LEN:-128} \
    --batch-sizes 0 --ks 3 5 --acceptance 0.6 0.8 --batch1-prompts ${BATCH1_PROMPTS:-3} \
    --out "$OUT/spec_decode_${CARD}_draft_cost_$C.json" 2>&1 | grep -vE "^\s*$" | tee "$OUT/spec_draft_cost_log_$C.txt" \
    | grep -E "^batch |wrote|Error|error" | tail -6
fi
if [[ "$STEPS" == *" bench1000 "* ]]; then
  echo "== replay benchmark 1000 / 1000, off vs auto, with the simulator's prediction ($(date +%T))"
  timeout ${BENCH1000_TIMEOUT:-360} $PY scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b \
    --load-format dummy --input-len 1000 --output-len 1000 --batch-sizes ${BATCH_SIZES:-64 256 448} --ks 3 5 \
    --throughput-acceptance 0.8 --policies auto --time-recording --batch1-prompts 0 --calibration-len 32 \
    --gpu-memory-utilization 0.95 --out "$OUT/spec_decode_${CARD}_replay1000_$C.json" 2>&1 | grep -vE "^\s*$" \
    | tee "$OUT/spec_bench1000_log_$C.txt" | grep -E "^batch |\"predicted\":|wrote|Error|error" | tail -12
fi
if [[ "$STEPS" == *" agent "* ]]; then
  echo "== coding-agent shapes (issue 21): AGENT_INPUT_LEN-token sessions, batch 4 and 32, k 8, auto vs off ($(date +%T))"
  timeout ${AGENT_TIMEOUT:-240} $PY scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b \
    --load-format dummy --input-len ${AGENT_INPUT_LEN:-16000} --output-len 256 --batch-sizes 4 32 --ks 8 \
    --throughput-acceptance 0.69 --policies auto --batch1-prompts 0 \
    --out "$OUT/spec_decode_agent_${CARD}_replay_$C.json" 2>&1 | grep -vE "^\s*$" | tee "$OUT/spec_agent_log_$C.txt" \
    | grep -E "^batch |wrote|Error|error" | tail -6
fi
echo "== done ($(date +%T))"
