"""A speculation policy's run in simulated time: `batch` requests decoding `output_len` tokens together (the
replay benchmark's throughput workload, scripts/bench_spec_decode.py), each step priced by `SpecStepCosts`.

Per step, in the async stepper's order (engine/async_output.py, `_needs_resolved_drafts`): the step in flight is
resolved early when it had drafts or the policy's `max_drafts` says the next may; only then does the policy's
`num_drafts` choose the drafts (else the step is plain). Each draft is accepted with probability `acceptance`
given the ones before it (the replay's marks under forced acceptance), and the policy observes the step's
tokens, draft tokens and seconds as the engine reports them. No scheduler, no model: the batch is fixed (no
arrivals, no preemption), so a step is `live` decodes plus the chosen drafts. Imports no torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

# model_executor/cuda_graph_runner.py MAX_PREFILL_SEQS: a speculative step with at most this many drafting
# requests replays a mixed graph (plain decodes + those requests as short prefill chunks); with more, a varlen
# graph that runs every sequence of the step through the prefill kernel
MIXED_MAX_SEQS = 8


@dataclass(frozen=True)
class SpecStepCosts:
    """Seconds per step: a plain decode step of `live` requests at `plain_s(live)` (linear between the measured
    batches in `plain`, flat beyond them), plus, for a step with drafts, `fixed_s + per_request_s * n +
    per_draft_s * drafts` (n: the requests drafting, or every live one beyond `MIXED_MAX_SEQS`: `step_s`).
    `early_s[batch]`: the host time an early-resolved plain step exposes (async scheduling hides it otherwise);
    `prefill_s[batch]`: the first step (the prompts' cached prefill) at that batch."""

    plain: dict[int, float]
    fixed_s: float
    per_request_s: float
    per_draft_s: float
    early_s: dict[int, float]
    prefill_s: dict[int, float]

    def plain_s(self, live: int) -> float:
        xs = sorted(self.plain)
        return float(np.interp(live, xs, [self.plain[x] for x in xs]))

    def step_s(self, live: int, num_drafting: int, num_drafts: int) -> float:
        """A step of `live` decodes, `num_drafting` of them with `num_drafts` drafts in all. Beyond
        `MIXED_MAX_SEQS` drafting requests every sequence pays `per_request_s` (the step replays a varlen graph,
        all its sequences through the prefill kernel); up to it only the drafting ones (they ride a mixed
        graph's prefill part beside the plain decodes)."""
        if not num_drafts:
            return self.plain_s(live)
        seqs = num_drafting if num_drafting <= MIXED_MAX_SEQS else live
        return self.plain_s(live) + self.fixed_s + self.per_request_s * seqs + self.per_draft_s * num_drafts

    @classmethod
    def fit(cls, plain: dict[int, float], spec_steps: list[tuple[int, float, float, float]],
            early_s: dict[int, float] | None = None, prefill_s: dict[int, float] | None = None) -> SpecStepCosts:
        """From plain step seconds per batch and measured speculative steps (batch, mean requests drafting, mean
        draft tokens, seconds per step; beyond `MIXED_MAX_SEQS` drafting requests, runs where every live request
        drafts, as the policy `always`): the extra over the plain step at that many requests fitted as fixed +
        per request + per draft token by non-negative least squares on relative errors (each point weighted by
        1 / its seconds, so batch 1's few milliseconds count as much as batch 448's hundred; a term the points
        cannot tell apart comes out 0).

        Raises:
            ValueError: no speculative step given.
        """
        if not spec_steps:
            raise ValueError("no speculative steps to calibrate from")
        probe = cls(dict(plain), 0.0, 0.0, 0.0, {}, {})
        weight = np.asarray([1.0 / s for *_, s in spec_steps])
        a = np.asarray([(1.0, n, d) for _, n, d, _ in spec_steps]) * weight[:, None]
        # beyond MIXED_MAX_SEQS a point's drafting requests are its live ones (`always`: every live one drafts)
        b = np.asarray([max(s - probe.plain_s(n if n > MIXED_MAX_SEQS else batch), 0.0)
                        for batch, n, _, s in spec_steps]) * weight
        fixed, per_request, per_draft = _nonnegative_least_squares(a, b)
        return cls(dict(plain), float(fixed), float(per_request), float(per_draft), dict(early_s or {}),
                   dict(prefill_s or {}))


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> list[float]:
    """argmin |a x - b| over x >= 0, for a few columns: the best of the least-squares fits on every subset of
    the columns whose coefficients are all >= 0 (the others 0); numpy only (scipy is a test dependency)."""
    columns = a.shape[1]
    best, best_residual = [0.0] * columns, float(np.sum(b * b))
    for mask in range(1, 2 ** columns):
        chosen = [j for j in range(columns) if mask >> j & 1]
        coef = np.linalg.lstsq(a[:, chosen], b, rcond=None)[0]
        if np.any(coef < 0):
            continue
        residual = float(np.sum((a[:, chosen] @ coef - b) ** 2))
        if residual < best_residual - 1e-18:
            best, best_residual = [0.0] * columns, residual
            for j, c in zip(chosen, coef):
                best[j] = float(c)
    return best


@dataclass
class _Request:
    num_draft_tokens_total: int = 0
    num_accepted_tokens_total: int = 0


def simulate(policy, batch: int, output_len: int, costs: SpecStepCosts, acceptance: float,
             seed: int = 0, spikes: dict[int, float] | None = None) -> dict:
    """One run of `policy` (a `make_policy` policy, or None: speculation off). `spikes`: extra seconds added to
    decode step i (0-based, after the prefill), for what a step's shape does not explain (a garbage-collector
    pause, a first-use compile). Returns steps, speculative steps, early-resolved steps, seconds (prefill step
    included), tokens, tokens per second and the largest number of requests that drafted in one step."""
    rng = random.Random(seed)
    requests = [_Request() for _ in range(batch)]
    produced = [1] * batch  # the prefill's token
    seconds = costs.prefill_s.get(batch, 1.5 * costs.plain_s(batch))
    if policy is not None:
        policy.observe_step(batch * 8, False, seconds, 0)
    early_s = costs.early_s.get(batch, 0.0)
    steps = spec_steps = early = widest = 0
    previous_drafts = False
    while min(produced) < output_len:
        live = [i for i in range(batch) if produced[i] < output_len]
        ks = [0] * len(live)
        resolved = policy is not None and (previous_drafts or policy.max_drafts(len(live)) > 0)
        if resolved:
            ks = policy.num_drafts([requests[i] for i in live], len(live))
            ks = [min(k, output_len - produced[i]) for i, k in zip(live, ks)]  # the max_tokens cap
        for i, d in zip(live, ks):
            accepted = 0
            while accepted < d and rng.random() < acceptance:
                accepted += 1
            requests[i].num_draft_tokens_total += d
            requests[i].num_accepted_tokens_total += accepted
            produced[i] = min(output_len, produced[i] + accepted + 1)
        drafts, drafting = sum(ks), sum(1 for k in ks if k)
        step = costs.step_s(len(live), drafting, drafts) + (early_s if resolved and not drafts else 0.0)
        step += (spikes or {}).get(steps, 0.0)
        if policy is not None:
            policy.observe_step(len(live) + drafts, drafts > 0, step, drafts, drafting)
        seconds += step
        previous_drafts = drafts > 0
        steps += 1
        spec_steps += drafts > 0
        early += resolved
        widest = max(widest, drafting)
    tokens = batch * output_len
    return {"steps": steps, "spec_steps": spec_steps, "early_resolved_steps": early, "seconds": seconds,
            "tokens": tokens, "tokens_per_s": tokens / seconds, "max_requests_drafting": widest}


def predicted_ratio(policy_name: str, k: int, batch: int, output_len: int, costs: SpecStepCosts,
                    acceptance: float, seed: int = 0, max_decode_rows: int = 448) -> dict:
    """The simulated throughput of `policy_name` ("always" / "auto") at k over speculation off's, with the
    run's counts; `max_decode_rows`: the engine's largest decode graph (the replay benchmark's max_num_seqs)."""
    from shared_engine.spec_decode.policy import make_policy

    config = SimpleNamespace(num_speculative_tokens=k, policy=policy_name)
    off = simulate(None, batch, output_len, costs, acceptance, seed)
    policy = make_policy(config)
    policy.padding = (MIXED_MAX_SEQS, k, max_decode_rows)  # as the engine's CUDA graphs run speculative steps
    on = simulate(policy, batch, output_len, costs, acceptance, seed)
    return {**on, "throughput_ratio": on["tokens_per_s"] / off["tokens_per_s"]}
