"""The simulator's predicted throughput ratio (speculation on / off) for scripts/bench_spec_decode.py's replay
throughput runs, calibrated from the same run's step costs only (never from a policy run's throughput):

- a plain step at batch B: the timed `off` run's seconds per step (at the measured output length, so at its
  contexts), and at batch 1 the batch-1 calibration `off` run's;
- a step with drafts: the calibration runs (`--calibration-len` tokens, same prompts, prefix-cached) with the
  policy `always` at each k, at batch B and at batch 1: the speculative steps' seconds over their `off`
  calibration run's, added to the plain step above, as (batch, requests drafting, draft tokens, seconds) points;
  `SpecStepCosts.fit` makes them fixed + per drafting request + per draft token;
- an early-resolved plain step: the `off` run's wall minus GPU span per step (0 without a GPU span).
The prediction (shared_engine/sim/spec_policy_sim.py: the real policy, in simulated time) is computed once the
calibration exists and before the policy runs it is compared to.
"""

from __future__ import annotations

from shared_engine.sim.spec_policy_sim import SpecStepCosts, predicted_ratio


def speculative_point(batch: int, run: dict, off_calibration: dict, plain_s: float) -> tuple | None:
    """One calibration `always` run (a `_spec_run` row) as (batch, requests drafting, draft tokens, seconds)
    per speculative step, its extra over its `off` calibration run (`StepCost` report) put on `plain_s`; None
    when it had no speculative step."""
    spec = round(run["steps"] * run["share_of_steps_speculating"])
    if spec == 0:
        return None
    off_step = off_calibration["wall_ms_per_step"] / 1e3
    spec_step = (run["seconds"] - (run["steps"] - spec) * off_step) / spec
    drafts = run["num_draft_tokens"] / spec
    return batch, drafts / max(run["mean_draft_length"], 1e-9), drafts, plain_s + max(spec_step - off_step, 0.0)


def calibrated_costs(batch: int, off_run: dict, calibration: dict, batch1: dict) -> SpecStepCosts:
    """`off_run`: the timed off run's row fields (`off_step_cost`, ...); `calibration` / `batch1`: {"off":
    StepCost report, "always": [rows]} at this batch and at batch 1."""
    off = off_run["off_step_cost"]
    plain = {batch: off["wall_ms_per_step"] / 1e3}
    if batch != 1:
        plain[1] = batch1["off"]["wall_ms_per_step"] / 1e3
    points = [p for b, cal in ((batch, calibration), (1, batch1)) for run in cal["always"]
              if (p := speculative_point(b, run, cal["off"], plain[b])) is not None]
    # no GPU span (a CPU run: no CUDA events, no async overlap to lose): nothing exposed
    gpu = off["gpu_span_ms_per_step"]
    early = {batch: max(off["wall_ms_per_step"] - gpu, 0.0) / 1e3 if gpu > 0 else 0.0}
    return SpecStepCosts.fit(plain, points, early)


def predict(batch: int, output_len: int, off_run: dict, calibration: dict, batch1: dict, policies, ks,
            acceptance: float) -> dict:
    """{"costs": the fitted step costs, "<policy>/k<k>": predicted throughput ratio and the simulated run's
    counts} for each policy and k."""
    costs = calibrated_costs(batch, off_run, calibration, batch1)
    out = {"costs": {"plain_s": {str(b): s for b, s in costs.plain.items()}, "fixed_s": costs.fixed_s,
                     "per_request_s": costs.per_request_s, "per_draft_s": costs.per_draft_s,
                     "early_s": costs.early_s.get(batch, 0.0)}}
    for policy in policies:
        for k in ks:
            out[f"{policy}/k{k}"] = predicted_ratio(policy, k, batch, output_len, costs, acceptance)
    return out
