"""Host cost per step of the auto policy on steps it declines (issue 17), on the CPU: the real `SpecDecoder`
(replay proposer) and `AutoPolicy`, and `SpecDecodeStats.on_step`, driven with fake step outputs at a batch of
B decoding requests, a step model fitted to H200-shaped costs (plain 38.7 ms at 448; a draft token 0.2 ms), so
nearly every step is declined (a probe every 256 steps, once the window has lost its last speculative step:
`steps_resolved_early`, `draft_tokens`). Per step, what the async stepper calls: `wants_drafts` (then, when it says yes,
`propose`), `on_step`, and the stats' `on_step`.

    python benchmarks/spec_policy_host_cost.py [--steps N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

from shared_engine.engine.spec_stats import SpecDecodeStats
from shared_engine.spec_decode.spec_decoder import SpecDecoder


def _decoder(k: int) -> SpecDecoder:
    config = SimpleNamespace(method="replay", num_speculative_tokens=k, policy="auto", acceptance_rate=0.8,
                             draft_token_probability=0.8)
    return SpecDecoder(config, 4096)


def _requests(batch: int) -> list:
    return [SimpleNamespace(request_id=f"r{i}", num_remaining_tokens=1, output_token_ids=[7] * 10,
                            num_draft_tokens_total=0, num_accepted_tokens_total=0, max_tokens=1000,
                            num_output_tokens=10, num_tokens=1010, draft_token_ids=[], prompt_token_ids=[1] * 1000)
            for i in range(batch)]


def _out(batch: int, requests: list):
    items = [SimpleNamespace(request=r, num_draft_tokens=0, needs_sample=True) for r in requests]
    return SimpleNamespace(scheduled=items, num_batched_tokens=batch, has_drafts=False, num_draft_tokens=0)


def measure(batch: int, steps: int, k: int = 3) -> dict:
    """Seconds of host time per declined step, and how many steps the policy resolved early / proposed."""
    spec = _decoder(k)
    # the replay proposer drafts nothing without recordings (and a probe that drafts nothing is retried every
    # few steps): a stand-in that drafts `cap` tokens, as a recorded replay does
    spec.proposer.propose = lambda eligible, caps: [[7] * cap for cap in caps]
    stats = SpecDecodeStats()
    requests = _requests(batch)
    plain = 0.0387 * (0.3 + 0.7 * batch / 448)
    # warm-up: a fit with plain steps of two shapes and speculative ones priced 0.2 ms per draft token
    for i in range(64):
        drafts = 8 * k * (i % 8 == 3) + 4 * k * (i % 8 == 7)
        tokens = batch + drafts if i % 16 else batch + 1000
        spec.policy.observe_step(tokens, drafts > 0, plain * (1 + 0.05 * (tokens > 2 * batch)) + 2e-4 * drafts,
                                 drafts)
    spec.propose(requests)  # a decision: at these costs, nothing drafts
    assert not any(r.draft_token_ids for r in requests)
    out = _out(batch, requests)
    sampled = {r.request_id: [7] for r in requests}
    early = total = 0
    started = time.perf_counter()
    for _ in range(steps):
        drafts = 0
        if spec.wants_drafts(batch):
            early += 1
            spec.propose(requests)
            drafts = sum(len(r.draft_token_ids) for r in requests)
            for r in requests:
                r.draft_token_ids = []
            total += drafts
        stats.on_step(out, sampled)  # (the step's drafts, if any, are not verified here: rates stay)
        step = SimpleNamespace(num_batched_tokens=batch + drafts, has_drafts=drafts > 0, num_draft_tokens=drafts)
        spec.on_step(step, plain + 2e-4 * drafts)
    seconds = (time.perf_counter() - started) / steps
    return {"batch": batch, "k": k, "steps": steps, "host_ms_per_step": round(seconds * 1e3, 4),
            "steps_resolved_early": early, "draft_tokens": total}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = [measure(b, args.steps, k) for b in (64, 256, 448) for k in (3, 5)]
    for row in rows:
        print(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
