"""One slow step must not turn the auto policy's speculation off (issue 17). On the H100 at 0b81da5
(benchmarks/results/spec_decode_h100_replay_0b81da5.json, batch 1, k 5, forced acceptance 0.8) `auto` drafted
on 17% of steps (x1.36) where `always` gave x3.14: a step slowed by something other than its shape (a
garbage-collector pause, a first-use compile) fitted as the price of speculating, the policy stopped, and a
request's rate and the window change only by speculating. The policy now leaves such steps out of its fit
(`auto_policy._spikes`) and neither charges nor counts a spiked probe against its probe budget."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import shared_engine.spec_decode.auto_policy as auto_policy
from shared_engine.sim.spec_policy_sim import SpecStepCosts, simulate
from shared_engine.spec_decode.auto_policy import AutoPolicy, _least_squares

# batch 1 on llama-3.1-8b as measured on the H100 at 0b81da5 (same file): a plain step 6.2 ms, a k = 5 step 6.56
COSTS = SpecStepCosts(plain={1: 0.0062}, fixed_s=0.0002, per_request_s=0.0, per_draft_s=0.00003, early_s={},
                      prefill_s={1: 0.045})
SPIKE_S = 0.05


def _policy() -> AutoPolicy:
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=5))
    policy.padding = (8, 5, 448)
    return policy


def _share(spike_at: int | None) -> float:
    run = simulate(_policy(), 1, 128, COSTS, 0.8, seed=0, spikes=None if spike_at is None else {spike_at: SPIKE_S})
    return run["spec_steps"] / run["steps"]


def test_a_slow_step_anywhere_leaves_batch_1_speculating():
    calm = _share(None)
    assert calm > 0.85
    for spike_at in range(40):  # the first probe, the steps before the fit, the fitted decisions
        assert _share(spike_at) >= calm - 0.03, spike_at


def test_without_the_spike_rule_one_slow_step_turns_speculation_off(monkeypatch):
    """The failure the rule fixes, reproduced: with `_spikes` flagging nothing, a 50 ms step early in the run
    leaves the request drafting on almost no step."""
    monkeypatch.setattr(auto_policy, "_spikes", lambda x, y, *_: np.zeros(len(y), dtype=bool))
    assert min(_share(spike_at) for spike_at in range(12)) < 0.1


def _steps(extra: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """A 1000-token prefill, 20 plain batch-1 steps at 6.2 ms and 10 k = 5 steps at 6.6 ms, then `extra`."""
    return [(1000, 0, 0.045)] + [(1, 0, 0.0062)] * 20 + [(6, 5, 0.0066)] * 10 + extra


def test_the_fit_leaves_out_a_step_its_peers_do_not_explain():
    clean, kept = _least_squares(_steps([]), None)
    fit, kept_with_spike = _least_squares(_steps([(5, 4, 0.056)]), None)
    assert kept == kept_with_spike == 10
    assert fit == pytest.approx(clean, rel=1e-6, abs=1e-9)


def test_two_slow_steps_that_agree_are_a_real_cost():
    """A new shape seen twice at the same cost predicts itself: believed (a 3-draft step at 30 ms)."""
    fit, kept = _least_squares(_steps([(4, 3, 0.030), (4, 3, 0.030)]), None)
    assert kept == 12
    c0, c1, c2, c3 = fit
    assert c0 + c1 + c2 + 3 * c3 > 0.012  # the fit moved towards them


def test_a_lone_speculative_step_is_judged_against_the_plain_step():
    """The window's only speculative step decides c2 / c3 alone (no peer predicts it): more than 3x the plain
    step of its tokens is a spike (the fit keeps no speculative step, so the next draft is a probe); at 1.2x it
    is the price of speculating."""
    plain = [(1000, 0, 0.045)] + [(1, 0, 0.0062)] * 20
    assert _least_squares(plain + [(6, 5, 0.056)], None)[1] == 0
    fit, kept = _least_squares(plain + [(6, 5, 0.0075)], None)
    assert kept == 1 and fit[3] * 5 + fit[2] == pytest.approx(0.0075 - 0.0062, rel=0.05)


def test_a_spiked_probe_is_neither_charged_nor_counted():
    policy = _policy()
    policy.observe_step(1000, False, 0.045, 0)
    for _ in range(10):
        policy.observe_step(1, False, 0.0062, 0)
    request = SimpleNamespace(num_accepted_tokens_total=0, num_draft_tokens_total=0)
    assert policy.num_drafts([request], 1) == [5]  # the first probe (free)
    policy.observe_step(6, True, 0.056, 5, 1)  # spiked
    assert policy.max_drafts(1) == 5  # another probe: the spike was not the price
    assert policy.num_drafts([request], 1) == [5]
    policy.observe_step(6, True, 0.0066, 5, 1)  # not spiked: charged
    fit = policy.step_time()
    assert policy._fit_speculative == 1 and fit[2] + 5 * fit[3] == pytest.approx(0.0004, rel=0.05)
