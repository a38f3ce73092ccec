"""The auto policy's host work on the steps it declines, and its widening cap (issue 17; H200 at 0f88fd9,
benchmarks/results/spec_decode_h200_replay1000_0f88fd9.json: at batch 448 a declined step's host time grew by
~2 ms with speculation configured, and steps drafting for more than 8 requests replayed a varlen graph, ~4x a
plain step). Counts work, never times it (benchmarks/spec_policy_host_cost.py times it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shared_engine.engine.spec_stats import SpecDecodeStats
from shared_engine.sim.spec_policy_sim import SpecStepCosts, predicted_ratio, simulate
from shared_engine.spec_decode import auto_policy
from shared_engine.spec_decode.auto_policy import _PROBE_REQUESTS, AutoPolicy, _choose, acceptance_rate

# shaped like 0f88fd9 at batch 448: a plain step 38.7 ms; a drafting request 0.2 ms, every live one beyond 8
# drafting (a varlen step, 448 * 0.2 ms = 90 ms more: ~3.3x a plain step)
H200 = SpecStepCosts({1: 0.0075, 64: 0.012, 256: 0.024, 448: 0.0387}, 0.0, 2e-4, 1e-6, {}, {})


def _per_request_reference(policy: AutoPolicy, requests: list, num_running: int) -> list[int]:
    """`num_drafts`'s choice computed per request (one table each, as before 8d1da87+1), for a decision step."""
    fit = policy.step_time()
    tables = [[auto_policy.expected_tokens(acceptance_rate(r), k) for k in range(policy.k + 1)] for r in requests]
    ks, drafting = _choose(fit, tables, [1] * len(requests), num_running, policy._cap(False))
    return [k if n else 0 for k, n in zip(ks, drafting)]


@pytest.mark.parametrize("costs,batch,acceptance", [
    (H200, 448, 0.9), (H200, 64, 0.9), (SpecStepCosts({1: 0.005, 448: 0.034}, 0.0005, 1e-6, 1e-7, {}, {}), 448, 0.8),
    (SpecStepCosts({1: 0.005, 64: 0.012}, 0.0005, 1e-5, 1e-6, {}, {}), 64, 0.6)])
def test_grouped_choice_equals_the_per_request_one(costs, batch, acceptance):
    """On a seeded simulated run, every non-probe decision (requests grouped by rate) gives each request the
    draft length the per-request computation gives, and some decisions draft."""
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=3))
    original, checked = policy.num_drafts, []

    def checking(requests, num_running):
        probing = policy._probing(policy.step_time())
        reference = None if probing else _per_request_reference(policy, requests, num_running)
        ks = original(requests, num_running)
        if reference is not None:
            assert ks == reference
            checked.append(any(ks))
        return ks

    policy.num_drafts = checking
    simulate(policy, batch, 300, costs, acceptance, seed=3)
    assert checked and any(checked)


def _declining(batch: int) -> tuple[AutoPolicy, list]:
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=3))
    plain = H200.plain_s(batch)
    for tokens, drafts in [(batch * 8, 0)] + [(batch, 0)] * 8 + [(batch + 24, 24), (batch + 12, 12)]:
        policy.observe_step(tokens, drafts > 0, H200.step_s(batch, drafts // 3, drafts) + 1e-3 * (drafts > 0),
                            drafts)
    requests = [SimpleNamespace(num_draft_tokens_total=90, num_accepted_tokens_total=40) for _ in range(batch)]
    return policy, requests


def test_declined_steps_do_constant_policy_work(monkeypatch):
    """At batch 448 with every request at one rate (acceptance 0.44: declined), `num_drafts` evaluates k + 1
    expected-token entries (one group), not 448 * (k + 1), and `max_drafts` the same; the stats' `on_step`
    does not look at the step's requests when it has no drafts."""
    policy, requests = _declining(448)
    calls = []
    real = auto_policy.expected_tokens
    monkeypatch.setattr(auto_policy, "expected_tokens", lambda a, k: calls.append(a) or real(a, k))
    assert policy.num_drafts(requests, 448) == [0] * 448
    assert len(calls) == policy.k + 1
    calls.clear()
    for _ in range(10):
        policy.observe_step(448, False, H200.plain_s(448), 0)
        assert policy.max_drafts(448) == 0
    assert len(calls) <= 10 * (policy.k + 1)

    class Untouchable:
        def __iter__(self):
            raise AssertionError("iterated a step without drafts")

    stats = SpecDecodeStats()
    stats.on_step(SimpleNamespace(scheduled=Untouchable(), num_draft_tokens=0), {})
    assert stats.log_fields() == (0.0, 1.0, 0.0)


@pytest.mark.parametrize("batch", [64, 256, 448])
def test_no_step_drafts_for_more_than_8_requests_at_h200_costs(batch):
    """Costs where a mixed-graph step's drafts pay at acceptance 0.9 but a step drafting for more than 8
    requests costs every live request 0.2 ms (the varlen graph): the policy never drafts for more than 8
    (before the cap, widening doubled from 8 to 16 and on), and stays >= 0.98x of speculation off."""
    run = predicted_ratio("auto", 3, batch, 1000, H200, 0.9)
    assert 0 < run["max_requests_drafting"] <= _PROBE_REQUESTS
    assert run["throughput_ratio"] >= 0.98


def test_window_ring_fits_as_the_step_list():
    """600 observed steps (the 256-step window wrapped): the fit from the policy's ring of rows is the one from
    the last 256 steps as a list, oldest first, exactly; and the counts of speculative steps are the window's."""
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=3))
    steps = []
    for i in range(600):
        drafts = 3 * (i % 7 == 0) * (1 + i % 3) + 30 * (i % 50 == 1)
        step = (64 + drafts + 512 * (i % 11 == 0), drafts, 0.012 + 1e-5 * i % 3 + 2e-4 * drafts)
        steps.append(step)
        policy.observe_step(step[0], drafts > 0, step[2], drafts)
        if i in (5, 100, 255, 256, 599):
            window = steps[-auto_policy._WINDOW:]
            if len(window) >= auto_policy._MIN_STEPS:
                assert policy.step_time() == auto_policy._least_squares(window, policy._fit)
            assert policy._num_speculative == sum(1 for s in window if s[1])
            assert policy._num_wide == sum(1 for s in window if s[1] > _PROBE_REQUESTS * 3)
