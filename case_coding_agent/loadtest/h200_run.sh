#!/usr/bin/env bash
# The case at the brief's scale on two H200s (one replica each, llama-3.1-8b preset with dummy weights, the
# h200 trace's synthetic token ids, nginx from the machine's package in front). Needs `nginx` installed
# (apt-get install nginx) and 2 GPUs. Expected: ~2 x 6 min (the trace is ~4 minutes of sessions plus the
# servers' start); writes first_attempt/results_h200.json and the_fix/results_h200.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
for variant in first_attempt the_fix; do
    python -m case_coding_agent.loadtest.run_case --profile h200 --variant "$variant" --synthetic-prompts --gpus
done
