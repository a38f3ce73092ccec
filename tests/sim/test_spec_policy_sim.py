"""The bench's simulator prediction (scripts/spec_sim_predict.py) from a run's off and `always` calibration steps:
fed the 9a99c62 H200 file's own runs as if they were the calibration, it reproduces each `always` run's measured
throughput ratio within the issue's 10%, and it never reads a policy run's throughput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.spec_sim_predict import calibrated_costs, predict, speculative_point
from shared_engine.sim.spec_policy_sim import SpecStepCosts, simulate

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/spec_decode_h200_replay_9a99c62.json"


def _rows() -> dict[int, dict]:
    body = json.loads(RESULTS.read_text())
    return {row["batch"]: row for row in body["results"]["batch1"] + body["results"]["throughput"]}


def _calibration(row: dict) -> dict:
    always = [r for r in row["runs"] if r["policy"] == "always" and r["draft_token_probability"] == 0.8]
    return {"off": row["off_step_cost"], "always": always}


@pytest.mark.parametrize("batch", [64, 256, 448])
def test_prediction_matches_the_measured_always_runs(batch):
    rows = _rows()
    row = rows[batch]
    auto_free = {**row, "runs": [r for r in row["runs"] if r["policy"] != "auto"]}  # nothing of auto's is read
    prediction = predict(batch, 128, auto_free, _calibration(auto_free), _calibration(rows[1]), ["always", "auto"],
                         [3, 5], 0.8)
    measured = {(r["policy"], r["k"]): r["throughput_ratio"] for r in row["runs"]
                if r["draft_token_probability"] == 0.8}
    for k in (3, 5):
        assert prediction[f"always/k{k}"]["throughput_ratio"] == pytest.approx(measured["always", k], rel=0.10)
        assert prediction[f"auto/k{k}"]["throughput_ratio"] >= 0.98
    assert prediction["costs"]["per_request_s"] > 1e-4  # ~0.2 ms per drafting request (9a99c62)


def test_speculative_point_and_costs():
    row = _rows()[448]
    run = next(r for r in row["runs"] if r["policy"] == "always" and r["k"] == 3)
    batch, drafting, drafts, seconds = speculative_point(448, run, row["off_step_cost"], 0.040)
    assert batch == 448 and 300 < drafting <= 448 and drafts == pytest.approx(3 * drafting, rel=0.05)
    assert seconds == pytest.approx(0.040 + 0.1003, rel=0.05)  # plain + the measured extra (~100 ms)
    costs = calibrated_costs(448, row, _calibration(row), _calibration(_rows()[1]))
    assert costs.plain == pytest.approx({448: 0.0345, 1: 0.0048}, rel=0.01)
    assert costs.early_s[448] == pytest.approx(0.0028, rel=0.02)  # wall - GPU span of the off steps


def test_off_simulation_is_plain_steps():
    costs = SpecStepCosts({1: 0.005, 64: 0.008}, 0.001, 0.0002, 0.0, {}, {64: 0.012})
    run = simulate(None, 64, 100, costs, 0.8)
    assert run["steps"] == 99 and run["spec_steps"] == 0
    assert run["seconds"] == pytest.approx(0.012 + 99 * 0.008)


def test_nonnegative_least_squares_matches_scipy():
    import numpy as np
    from scipy.optimize import nnls

    from shared_engine.sim.spec_policy_sim import _nonnegative_least_squares

    rng = np.random.default_rng(0)
    for _ in range(100):
        a, b = rng.random((6, 3)), rng.normal(size=6)
        ours = np.asarray(_nonnegative_least_squares(a, b))
        assert (ours >= 0).all()
        assert np.linalg.norm(a @ ours - b) == pytest.approx(np.linalg.norm(a @ nnls(a, b)[0] - b), abs=1e-9)
