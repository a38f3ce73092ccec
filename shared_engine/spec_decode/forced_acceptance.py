"""`ForcedAcceptance` -- BENCHMARK ONLY, never for serving: the rejection sampler's outcome decided by the
replay proposer instead of by the target's logits.

Dummy weights make greedy verification reject nearly every draft (bf16 logits of random weights near-tie, so
the k + 1-query path flips the argmax of the recorded continuation almost at once), so a speed-up at a set
acceptance cannot be measured honestly by comparing logits. With this hook the replay proposer
(`replay_proposer.py`) says, per draft, whether it is "right" (drawn with its `acceptance_rate`, seeded) and
what the recorded continuation is; the rejection sampler still runs in full (logits processors, the accept
kernel, every device tensor), but before the accept kernel the per-row inputs of those requests are replaced:
p(d_j) = 1 for a right draft and 0 for a wrong one, and the recovered / bonus token of each row is the
recorded one. The kernel then accepts exactly the right drafts up to the first wrong one and emits the
recorded token there, so the output is the recorded continuation and every step carries the accepted tokens
the replay intends, while the forward pass, CUDA graphs, input building and host paths run as in serving.

Reachable only through `LLMEngine(config, benchmark_forced_acceptance=True)` (or `LLM(...,
benchmark_forced_acceptance=True)`): neither the server nor the CLI nor the YAML config has a way to set it.
"""

from __future__ import annotations

import torch

from shared_engine.sampling.device_tensor import to_device


class ForcedAcceptance:
    """Overrides verification for requests whose drafts the current proposer can vouch for.

    `proposer` is a callable returning the spec decoder's proposer (looked up per step, so a benchmark may
    swap the proposer after the engine is built); a proposer takes part by having
    `forced_outcome(request, draft) -> (marks, tokens) | None`: marks[j] whether draft j is right (len(draft)
    entries), tokens the recorded continuation at the step's positions (up to len(draft) + 1 entries)."""

    def __init__(self, proposer) -> None:
        self._proposer = proposer

    def override(self, requests: list, drafts: list[list[int]], target_p: torch.Tensor,
                 recovered: torch.Tensor) -> None:
        """Rewrite, in place, `target_p` [num_rows] fp32 (p(d) of each draft row) and `recovered` [num_rows]
        int64 (the residual or bonus draw of each row) for the rows of requests with a forced outcome; rows
        follow `RejectionSampler.sample`'s layout (per request its len(d) draft rows, then its bonus row)."""
        lookup = getattr(self._proposer(), "forced_outcome", None)
        if lookup is None:
            return
        p_rows, p_values, rec_rows, rec_values = [], [], [], []
        row = 0
        for request, draft in zip(requests, drafts):
            outcome = lookup(request, draft)
            if outcome is not None:
                marks, tokens = outcome
                p_rows += range(row, row + len(draft))
                p_values += [1.0 if m else 0.0 for m in marks[:len(draft)]]
                tokens = tokens[:len(draft) + 1]
                rec_rows += range(row, row + len(tokens))
                rec_values += tokens
            row += len(draft) + 1
        device = target_p.device
        if p_rows:
            target_p.index_copy_(0, to_device(p_rows, torch.long, device),
                                 to_device(p_values, target_p.dtype, device))
        if rec_rows:
            recovered.index_copy_(0, to_device(rec_rows, torch.long, device),
                                  to_device(rec_values, recovered.dtype, device))
