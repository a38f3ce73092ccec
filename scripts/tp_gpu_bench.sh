#!/usr/bin/env bash
# Tensor parallelism on 2 GPUs of one host (issue 24), every results file into OUTDIR. Not run yet: the
# multi-GPU machine kinds were not lent when it was written (README, "Tensor parallelism").
#   GIT_COMMIT=$(git rev-parse HEAD) scripts/tp_gpu_bench.sh OUTDIR      (the device copy has no .git)
# STEPS (default all; any of: tests tp1 tp2 batch1 profile 70b-batch1 70b): split over calls of <= 10 min,
# e.g. STEPS="tests tp1 tp2 batch1" (~8 min on 2 H200s, estimated) then STEPS="profile 70b-batch1 70b".
#   tests       the TP tests: on the CPU (gloo) as in CI, and test_tensor_parallel_gpu.py (NCCL, CUDA graphs
#               per rank, fp32): 2 GPUs vs 1, greedy tokens identical
#   tp1, tp2    llama-3.1-8b dummy, 1,000 x (1,000 in, 1,000 out) at TP=1 then TP=2, same session
#   batch1      llama-3.1-8b batch-1 TPOT at TP=1 and TP=2 (against the weight-streaming floor over N GPUs)
#   profile     llama-3.1-8b step profile at TP=2, then the capacity model's all-reduce fit (tp_calibrate.py)
#   70b-batch1  llama-3.1-70b dummy at TP=2: batch-1 TPOT against its floor (weights / (2 x copy bandwidth))
#   70b         llama-3.1-70b dummy at TP=2: 1,000 x (1,000 in, 1,000 out)
# NCCL: NVLink multicast (NVLS) off, as the device notes require (the engine sets it too).
set -uo pipefail
OUT=${1:?usage: tp_gpu_bench.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd):${PYTHONPATH:-}" NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
STEPS=" ${STEPS:-all} "
want() { [[ "$STEPS" == *" all "* || "$STEPS" == *" $1 "* ]]; }
step() { echo "== $1 ($(date +%T))"; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/nvidia_smi.txt"
nvidia-smi topo -m > "$OUT/nvidia_topo.txt" 2>&1
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "needs 2 GPUs"; exit 1; }

OFFLINE="--load-format dummy --input-len-min 1000 --input-len-max 1000 --output-len-min 1000 --output-len-max 1000
  --max-model-len 2048 --max-num-batched-tokens 8192 --num-requests 1000 --hf-mode none --roofline --async-scheduling"
BATCH1="--load-format dummy --num-requests 1 --input-len-min 32 --input-len-max 32 --output-len-min 256
  --output-len-max 256 --max-model-len 512 --max-num-seqs 8 --hf-mode none --roofline --async-scheduling"
show() { grep -E "ours|roofline|TPOT|wrote|Error|error" | tail -6; }

if want tests; then
  step "TP tests on CUDA"
  timeout 300 $PY -m pytest -q -x -p no:cacheprovider tests/engine/test_tp_partition.py \
    tests/engine/test_tensor_parallel.py tests/engine/test_tensor_parallel_gpu.py \
    tests/server/test_tensor_parallel_server.py 2>&1 | tail -3 | tee "$OUT/tp_tests.txt"
fi
if want tp1; then
  step "llama-3.1-8b 1000 x 1000, TP=1"
  timeout 240 $PY scripts/bench_offline.py --model llama-3.1-8b $OFFLINE --max-num-seqs 448 \
    --tensor-parallel-size 1 --out "$OUT/offline_llama8b_1000x1000_tp1.json" 2>&1 | show
fi
if want tp2; then
  # twice the KV pool (each GPU holds half of every block's heads): room for ~900 requests of 2,000 tokens
  step "llama-3.1-8b 1000 x 1000, TP=2"
  timeout 240 $PY scripts/bench_offline.py --model llama-3.1-8b $OFFLINE --max-num-seqs 512 \
    --tensor-parallel-size 2 --out "$OUT/offline_llama8b_1000x1000_tp2.json" 2>&1 | show
fi
if want batch1; then
  for tp in 1 2; do
    step "llama-3.1-8b batch-1 decode, TP=$tp"
    timeout 120 $PY scripts/bench_offline.py --model llama-3.1-8b $BATCH1 --tensor-parallel-size $tp \
      --out "$OUT/decode_batch1_llama8b_tp$tp.json" 2>&1 | show
  done
fi
if want profile; then
  step "llama-3.1-8b step profile at TP=2, then the all-reduce fit"
  timeout 300 $PY scripts/profile_steps.py --model llama-3.1-8b --load-format dummy --tensor-parallel-size 2 \
    --max-num-seqs 448 --max-num-batched-tokens 8192 --max-model-len 8192 \
    --out "$OUT/steps_h200x2_llama-3.1-8b_tp2.json" 2>&1 | tail -2
  $PY scripts/tp_calibrate.py --profile "$OUT/steps_h200x2_llama-3.1-8b_tp2.json" --gpu h200 \
    --out "$OUT/tp_calibration_h200x2.json" 2>&1 | tail -12
fi
if want 70b-batch1; then
  step "llama-3.1-70b dummy batch-1 decode, TP=2"
  timeout 240 $PY scripts/bench_offline.py --model llama-3.1-70b $BATCH1 --tensor-parallel-size 2 \
    --out "$OUT/decode_batch1_llama70b_tp2.json" 2>&1 | show
fi
if want 70b; then
  # per GPU ~56 GB of KV after its 70.5 GB shard at 0.9 utilisation: ~340k tokens, ~170 requests of 2,000
  step "llama-3.1-70b dummy 1000 x 1000, TP=2"
  timeout 540 $PY scripts/bench_offline.py --model llama-3.1-70b $OFFLINE --max-num-seqs 256 \
    --tensor-parallel-size 2 --out "$OUT/offline_llama70b_1000x1000_tp2.json" 2>&1 | show
fi
echo "== done ($(date +%T))"
