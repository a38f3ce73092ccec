"""The batch case's cost model: calibrated to the measured H200 run, sized by arithmetic that adds up."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from case_batch_summarisation import cost_model

    out = tmp_path_factory.mktemp("cost") / "cost.json"
    r = cost_model.main(["--num-requests", "300", "--gpus", "h200,l4", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))
    return r


def test_calibrated_to_the_measured_h200_run(result):
    measured = json.loads((ROOT / "case_batch_summarisation" / "the_fix" / "offline_h200.json").read_text())["run"]
    h200 = result["gpus"]["h200"]
    assert h200["tickets_per_s"] == pytest.approx(measured["rows_per_s"])
    cal = result["calibration"]
    assert 0.7 < cal["calibration_factor"] < 1.4  # the capacity model is near the measurement before correction


def test_night_arithmetic(result):
    for entry in result["gpus"].values():
        rate, one, ten = entry["tickets_per_s"], entry["1x"], entry["10x"]
        assert one["tickets_per_s_needed"] == pytest.approx(2_000_000 / 8 / 3600)
        assert one["gpus"] == math.ceil(one["tickets_per_s_needed"] / rate)
        assert ten["gpus"] == math.ceil(10 * one["tickets_per_s_needed"] / rate)
        assert one["hours_on_that_fleet"] <= 8.0
        assert one["gpu_hours_of_work"] == pytest.approx(2_000_000 / rate / 3600)
        price = entry["simulated"]["price_usd_per_hour"]
        assert one["usd_per_million_tokens"] == pytest.approx(
            one["cost_usd_gpu_hours"] / (2_000_000 * result["tokens_per_ticket"] / 1e6))
        assert one["cost_usd_fleet_for_window"] == pytest.approx(one["gpus"] * 8 * price)
    assert result["gpus"]["h200"]["1x"]["gpus"] <= 2  # the brief's target
    assert result["gpus"]["l4"]["tickets_per_s"] < result["gpus"]["h200"]["tickets_per_s"] / 4
