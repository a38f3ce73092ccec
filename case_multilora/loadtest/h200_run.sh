#!/usr/bin/env bash
# The case on one H200 (not run yet: no GPU time was left for it). From the repository root:
#   bash case_multilora/loadtest/h200_run.sh          # about 25 minutes: adapters ~1 min, 5 runs of ~4-5 min
# 1. 30 random adapters of the brief's ranks (q/k/v/o, bf16) with llama-3.1-8b's shapes;
# 2. throughput: base vs 30 mixed-rank adapters, all at once (scripts/bench_lora.py, ~2 min);
# 3. locust through the gateway: isolated, first attempt (max_loras 1, FCFS, no limits), the fix (32 slots,
#    fair, limits), the base model at the fix's load (case_multilora/loadtest/run_loadtest.py --profile h200);
# 4. the comparison and plots (report.py --profile h200).
# On the lent H200 (no network) it needs more than the device has: locust (not there; h200_quick.sh uses
# async_users.py instead), uvicorn + limits + deprecated and fastapi/pydantic wheels, and a tokenizer for the
# dummy model (h200_quick.sh: wide_tokenizer.py). h200_quick.sh is the one-call (~6 min) version.
set -euo pipefail
cd "$(dirname "$0")/../.."
ADAPTERS=${ADAPTERS:-/tmp/multilora_adapters}
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
python scripts/make_adapters.py random --model llama-3.1-8b --ranks 8 16 64 --count 10 --out "$ADAPTERS"
python scripts/bench_lora.py --num-requests 240 --out case_multilora/the_fix/bench_lora_h200.json
for variant in isolated first_attempt the_fix base; do
    python case_multilora/loadtest/run_loadtest.py --profile h200 --variant "$variant" --adapters-dir "$ADAPTERS" \
        --duration-s 180
done
python case_multilora/loadtest/report.py --profile h200
