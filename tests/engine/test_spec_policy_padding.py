"""The auto policy prices the CUDA graph runner's padded speculative steps (issue 17): beyond MAX_PREFILL_SEQS (8)
drafting requests a step replays a varlen graph that runs every sequence at k + 1 query tokens, so its cost is
k draft tokens for every sequence. At 0f88fd9 (benchmarks/results/spec_decode_h200_replay1000_0f88fd9.json,
batch 448, k 5) the linear fit, calibrated on 8-request steps, let 21 steps draft for 9-16 requests, each ~3.6x
a plain step, and the policy ran at 0.931x of speculation off."""

from __future__ import annotations

from types import SimpleNamespace

from shared_engine.model_executor.cuda_graph_runner import MAX_PREFILL_SEQS
from shared_engine.sim.spec_policy_sim import MIXED_MAX_SEQS
from shared_engine.spec_decode.auto_policy import AutoPolicy, _choose, expected_tokens


def _tables(rate: float, k: int, n: int) -> list[list[float]]:
    return [[expected_tokens(rate, j) for j in range(k + 1)]] * n


def test_the_simulator_and_the_runner_agree_on_the_limit():
    assert MIXED_MAX_SEQS == MAX_PREFILL_SEQS


def test_a_padded_step_is_observed_as_drafts_for_every_sequence():
    policy = AutoPolicy(SimpleNamespace(num_speculative_tokens=5))
    policy.padding = (8, 5, 448)
    policy.observe_step(448 + 16 * 5, True, 0.13, 16 * 5, num_drafting=16)  # 16 drafting: a varlen graph
    policy.observe_step(448 + 8 * 5, True, 0.04, 8 * 5, num_drafting=8)  # 8 drafting: a mixed graph
    assert list(policy._steps) == [(448 * 6, 448 * 5, 0.13), (448 + 40, 40, 0.04)]


def test_choose_keeps_narrow_steps_where_padding_would_pay_for_the_whole_batch():
    """A draft token costs 10 us: 8 requests drafting at acceptance 0.8 pay; 16 would pay for 448 x 5 padded
    drafts (22 ms on a 35 ms step). Without padding the linear model widens to 16."""
    fit = (0.034, 0.0, 0.001, 1e-5)
    tables = _tables(0.8, 5, 448)
    ks, drafting = _choose(fit, tables, [1] * 448, 448, cap=16, padding=(8, 5, 448))
    assert sum(drafting) == 8 and all(k == 5 for k, n in zip(ks, drafting) if n)
    _, drafting = _choose(fit, tables, [1] * 448, 448, cap=16, padding=None)
    assert sum(drafting) == 16


def test_choose_drafts_for_every_request_where_the_rows_fit_a_decode_graph():
    """At batch 32 every request drafting is 192 decode rows (<= 448, the largest decode graph): linear, no
    padding, so with cheap draft tokens all 32 draft."""
    fit = (0.007, 0.0, 0.0005, 2e-5)
    ks, drafting = _choose(fit, _tables(0.8, 5, 32), [1] * 32, 32, cap=32, padding=(8, 5, 448))
    assert sum(drafting) == 32 and set(ks) == {5}


def test_choose_takes_the_padded_step_where_it_pays():
    """At batch 100 at most 69 drafting requests fit 448 decode rows; with cheap draft tokens the padded step
    (all 100 drafting, 500 padded drafts) beats 69 as decode rows; with dear ones 69 (or fewer) win."""
    tables = _tables(0.8, 5, 100)
    _, drafting = _choose((0.010, 0.0, 0.0005, 2e-5), tables, [1] * 100, 100, cap=100, padding=(8, 5, 448))
    assert sum(drafting) == 100
    _, drafting = _choose((0.010, 0.0, 0.0005, 5e-5), tables, [1] * 100, 100, cap=100, padding=(8, 5, 448))
    assert 0 < sum(drafting) <= 69


def test_a_batch_of_at_most_8_is_never_padded():
    fit = (0.005, 0.0, 0.0005, 1e-4)
    ks, drafting = _choose(fit, _tables(0.9, 5, 6), [1] * 6, 6, cap=16, padding=(8, 5, 448))
    assert sum(drafting) == 6 and all(ks)
