#!/usr/bin/env bash
# GPU inputs of the capacity model's H200 fidelity check (issue 6): a step profile of each model, then the
# two offline workloads of the GPU issue measured in the same session. scripts/sim_fidelity_gpu.py turns them
# into predicted-vs-measured figures on any machine.
#   GIT_COMMIT=$(git rev-parse HEAD) scripts/gpu_fidelity_runs.sh OUTDIR   (the device copy has no .git)
set -uo pipefail
OUT=${1:?usage: gpu_fidelity_runs.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}"
PY=${PYTHON:-python3}
step() { echo "== $1 ($(date +%T))"; }

# Each profile under its offline workload's engine config (max_model_len, max_num_seqs, token budget): the
# decode graphs' attention splits and the graph buckets follow the config, so a profile recorded under
# another config calibrates other steps (a 0.6B model's steps are dominated by them).
step "step profile llama-3.1-8b"
timeout 200 $PY scripts/profile_steps.py --model llama-3.1-8b --load-format dummy --max-num-seqs 448 \
  --max-num-batched-tokens 8192 --max-model-len 2048 --out "$OUT/h200_llama-3.1-8b.json" 2>&1 | tail -3
step "step profile qwen3-0.6b"
timeout 120 $PY scripts/profile_steps.py --model qwen3-0.6b --load-format dummy --max-num-seqs 256 \
  --max-num-batched-tokens 8192 \
  --max-model-len 2048 --out "$OUT/h200_qwen3-0.6b.json" 2>&1 | tail -3

step "offline llama-3.1-8b 1000 x (1000 in, 1000 out)"
timeout 220 $PY scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --input-len-min 1000 \
  --input-len-max 1000 --output-len-min 1000 --output-len-max 1000 --max-model-len 2048 --max-num-seqs 448 \
  --max-num-batched-tokens 8192 --num-requests 1000 --hf-mode none --roofline \
  --out "$OUT/offline_llama8b_1000x1000.json" 2>&1 | grep -E "ours|roofline|Error"
step "offline qwen3-0.6b, nano-vllm workload"
timeout 100 $PY scripts/bench_offline.py --model qwen3-0.6b --load-format dummy --num-requests 256 \
  --input-len-min 100 --input-len-max 1024 --output-len-min 100 --output-len-max 1024 --max-model-len 2048 \
  --max-num-seqs 256 --hf-mode none --roofline --out "$OUT/offline_qwen3_0.6b_nanovllm.json" 2>&1 \
  | grep -E "ours|roofline|Error"
step "done"
