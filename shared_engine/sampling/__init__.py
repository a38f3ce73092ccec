"""Token sampling: penalties, temperature, top-k / top-p / min-p, per-sequence random streams, logprobs."""
