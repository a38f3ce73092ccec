"""The auto policy against step costs shaped like those measured on the H200 at 9a99c62 (issue 17;
benchmarks/results/spec_decode_h200_replay_9a99c62.json: llama-3.1-8b dummy, 1000-token prompts, forced
acceptance 0.8), in simulated time (shared_engine/sim/spec_policy_sim.py): a plain step at each batch's measured
ms/step, a step with drafts at that plus the extra the `always` runs measured, fitted per batch as fixed +
per drafting request + per draft token (with batch 1's runs). There a step with every request at k = 3 cost
2.6x / 4.2x / 3.9x a plain one at batch 64 / 256 / 448, and the policy (whose probe gave every request k) ran at
0.94-1.01x of speculation off. The issue's target: >= 0.98x at batch 64, 256 and 448 on the 1,000 / 1,000
workload; at batch 1 speculation still pays."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared_engine.sim.spec_policy_sim import SpecStepCosts, predicted_ratio, simulate
from shared_engine.spec_decode.auto_policy import _PROBE_REQUESTS, AutoPolicy

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/spec_decode_h200_replay_9a99c62.json"


def _points() -> tuple[dict[int, float], dict[int, float], list[tuple[int, float, float, float]], dict]:
    """(plain seconds per step by batch, host seconds an early resolve exposes by batch, speculative steps as
    (batch, requests drafting, draft tokens, seconds), the measured throughput ratios by (batch, policy, k)) from
    the 9a99c62 file's acceptance-0.8 runs (batch 1's at 0.6 too)."""
    body = json.loads(RESULTS.read_text())
    rows = body["results"]["batch1"] + body["results"]["throughput"]
    plain, early, points, measured = {}, {}, [], {}
    for row in rows:
        batch, off = row["batch"], row["off_step_cost"]
        plain[batch] = off["wall_ms_per_step"] / 1e3
        early[batch] = (off["wall_ms_per_step"] - off["gpu_span_ms_per_step"]) / 1e3
        for run in row["runs"]:
            measured[batch, run["policy"], run["k"], run["draft_token_probability"]] = run["throughput_ratio"]
            if run["policy"] != "always":
                continue
            spec = round(run["steps"] * run["share_of_steps_speculating"])
            seconds = (run["seconds"] - (run["steps"] - spec) * plain[batch]) / spec
            drafts = run["num_draft_tokens"] / spec
            points.append((batch, drafts / run["mean_draft_length"], drafts, seconds))
    return plain, early, points, measured


def _costs(batch: int) -> SpecStepCosts:
    plain, early, points, _ = _points()
    return SpecStepCosts.fit(plain, [p for p in points if p[0] in (1, batch)], early)


def test_costs_reproduce_the_measured_steps():
    """The fitted step costs give back each measured speculative step within 2%, and the `always` policy's
    simulated throughput ratio the measured one within 10% (the issue's bound for the simulator)."""
    plain, _, points, measured = _points()
    for batch in (64, 256, 448):
        costs = _costs(batch)
        for b, n, d, seconds in points:
            if b == batch:  # `always`: every live request drafts, n of them on average
                assert costs.step_s(round(n), n, d) == pytest.approx(seconds, rel=0.02)
        for k in (3, 5):
            sim = predicted_ratio("always", k, batch, 128, costs, 0.8)["throughput_ratio"]
            assert sim == pytest.approx(measured[batch, "always", k, 0.8], rel=0.10)
            assert costs.step_s(batch, batch, batch * k) / costs.plain_s(batch) > 2.4  # whole batch: > 2.4x


@pytest.mark.parametrize("output_len", [128, 1000])
@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("batch", [64, 256, 448])
def test_auto_at_least_098_of_off(batch, k, output_len):
    """9a99c62's policy probed with every request at k (a 3.9x step at batch 448; measured 0.94-0.96x at k = 5,
    simulated here 0.981-0.994x at 128 tokens, the rest of the measured loss being what the simulation does not
    model: host work, run-to-run noise). Now the probe drafts for at most 8 requests and widening at most
    doubles per step: >= 0.99x at 128 tokens (a margin for the unmodelled), >= 0.98x at 1000."""
    run = predicted_ratio("auto", k, batch, output_len, _costs(batch), 0.8)
    assert run["throughput_ratio"] >= (0.99 if output_len == 128 else 0.98)
    assert run["spec_steps"] <= 0.05 * run["steps"]


def test_probe_drafts_for_few_requests_and_widening_at_most_doubles():
    """A batch of 448 where speculating pays (a draft token costs little): the probe drafts for 8 requests, and
    each later step for at most twice the last's, up to the whole batch."""
    costs = SpecStepCosts({1: 0.005, 448: 0.034}, 0.0005, 1e-6, 1e-7, {}, {})
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=3))
    widths = []
    original = policy.num_drafts

    def recording(requests, num_running):
        ks = original(requests, num_running)
        widths.append(sum(1 for k in ks if k))
        return ks

    policy.num_drafts = recording
    run = simulate(policy, 448, 200, costs, 0.8)
    drafting = [w for w in widths if w]
    assert drafting[0] <= _PROBE_REQUESTS
    assert all(b <= max(_PROBE_REQUESTS, 2 * a) for a, b in zip(widths, widths[1:]))
    assert max(drafting) == 448
    assert run["spec_steps"] > 0.5 * run["steps"]


def test_fit_has_a_per_draft_token_term():
    """A probe at 8 requests then wider steps: the fit prices each draft token (c3), so a step drafting for the
    whole batch is predicted at its cost, not at the probe's extra (a fixed c2 would price 448 requests' drafts
    as 8 requests')."""
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=3))
    plain, per_draft = 0.0345, 0.0002 / 3  # 0.2 ms per drafting request at k = 3
    for tokens, drafts in [(448 * 8, 0)] + [(448, 0)] * 20 + [(448 + 24, 24), (448 + 48, 48), (448 + 96, 96)]:
        policy.observe_step(tokens, drafts > 0, plain * (1 + 0.1 * (tokens > 1000)) + per_draft * drafts, drafts)
    c0, c1, c2, c3 = policy.step_time()
    assert c3 == pytest.approx(per_draft, rel=0.01) and c2 == pytest.approx(0.0, abs=1e-6)
    assert not any(policy.num_drafts([SimpleNamespace(num_draft_tokens_total=90, num_accepted_tokens_total=72)]
                                     * 448, 448))  # acceptance 0.8, a draft token ~2.3 ms of throughput: off


@pytest.mark.parametrize("k", [3, 5])
def test_batch1_still_speculates(k):
    """At batch 1 a speculative step costs 1.3x a plain one: speculation on nearly every step, > 2x (k = 5)."""
    run = predicted_ratio("auto", k, 1, 1000, _costs(64), 0.8)
    assert run["spec_steps"] >= 0.95 * run["steps"]
    assert run["throughput_ratio"] > (2.0 if k == 5 else 1.8)


def test_back_on_when_the_batch_shrinks_to_one():
    """600 steps at batch 448, then 600 at batch 1: once the large batch's probes have left the window, a probe
    at batch 1 (within the budget) measures it cheap, and speculation is back."""
    costs = _costs(448)
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=3))
    big = simulate(policy, 448, 600, costs, 0.8)
    small = simulate(policy, 1, 600, costs, 0.8)
    assert big["spec_steps"] <= 0.02 * big["steps"]
    assert small["spec_steps"] >= 0.8 * small["steps"]
