"""case_multilora/cost_model.py: the crossover is where the two per-token costs meet, the dedicated cost is above
the shared one below it and not above it past it, true Zipf rates, fleets that cover the demand, and the
committed cost_model.json is what the script prints now."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from case_multilora import cost_model as cm

INPUTS = cm.CostInputs(base_capacity=10_000.0, shared_capacity=3_000.0, price_per_hour=4.0, utilisation=0.5)


def test_crossover_is_where_the_costs_meet():
    r = cm.crossover_rate(INPUTS)
    assert r == pytest.approx(1_500.0)
    assert cm.dedicated_cost(r, INPUTS) == pytest.approx(cm.shared_cost(INPUTS))
    for rate in (10.0, 500.0, 0.99 * r):
        assert cm.dedicated_cost(rate, INPUTS) > cm.shared_cost(INPUTS)
    for rate in (1.01 * r, 4_999.0, 5_000.0, 20_000.0):  # ceil steps: never above the shared cost past r*
        assert cm.dedicated_cost(rate, INPUTS) <= cm.shared_cost(INPUTS) + 1e-12, rate


def test_dedicated_needs_whole_gpus():
    assert cm.dedicated_gpus(1.0, INPUTS) == 1
    assert cm.dedicated_gpus(5_000.0, INPUTS) == 1 and cm.dedicated_gpus(5_001.0, INPUTS) == 2
    assert cm.shared_gpus(3_001.0, INPUTS) == 3


def test_usd_per_million():
    # one GPU at $3.6/h serving 1,000 tokens/s = 3.6M tokens/h -> $1 per 1M
    assert cm.usd_per_million(1, 1_000.0, 3.6) == pytest.approx(1.0)


def test_true_zipf():
    rates = cm.zipf_rates(30, 600.0, s=1.1)
    assert sum(rates) == pytest.approx(600.0)
    assert rates[0] / rates[1] == pytest.approx(2 ** 1.1) and rates[0] / rates[9] == pytest.approx(10 ** 1.1)
    assert all(a > b for a, b in zip(rates, rates[1:]))


def test_fleet_covers_the_demand_and_hybrid_is_cheapest():
    rates = cm.zipf_rates(300, 60_000.0)
    f = cm.fleet(rates, INPUTS)
    assert f["shared_gpus"] * INPUTS.utilisation * INPUTS.shared_capacity >= sum(rates)
    assert f["dedicated_gpus"] >= 300
    assert f["hybrid_gpus"] <= min(f["shared_gpus"] + 1, f["dedicated_gpus"])
    assert f["num_dedicated_in_hybrid"] == sum(r > cm.crossover_rate(INPUTS) for r in rates) > 0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="utilisation"):
        replace(INPUTS, utilisation=0)
    with pytest.raises(ValueError, match="shared_capacity"):
        replace(INPUTS, shared_capacity=20_000.0)


def test_committed_json_matches_the_model():
    committed = json.loads((cm.CASE_DIR / "cost_model.json").read_text())
    fresh = cm.report(cm.measured_inputs())
    assert committed["cases"] == json.loads(json.dumps(fresh["cases"]))
    assert committed["measured_context"] == cm.measured_context()
    runs = json.loads(cm.LORA_RESULTS.read_text())["runs"]
    assert cm.LORA_RESULTS.name == "lora_h200_llama8b_c518670.json"  # the newest H200 LoRA run
    measured = committed["cases"]["measured"]
    assert measured["shared_capacity_tok_s"] == runs["mixed_8_16_64"]["output_tok_s"] == 10631.3
    assert committed["inputs"]["base_capacity"] == runs["base"]["output_tok_s"]
    assert math.isclose(measured["crossover_rate_tok_s"], 0.7 * 10631.3, rel_tol=1e-3)
