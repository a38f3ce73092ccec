# Sourced by the GPU check scripts: CARD, the lent card's short name for results file names (h100, h200, ...;
# "gpu" when nvidia-smi names none of them). The device may lend an H100 for a call that asked for an H200, and a
# file named for the card it did not run on misleads every later reader.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | grep -o -i -E 'h100|h200|h20|b200|a100|l40s|l4' | head -1 | tr '[:upper:]' '[:lower:]')
CARD=${CARD:-gpu}
