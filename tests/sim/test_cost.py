"""The cost formulas on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from shared_engine.sim.cost import (
    api_cost_usd,
    cost_summary,
    fewest_replicas,
    meets_slo,
    usd_per_million_tokens,
)
from shared_engine.sim.workload_spec import ApiPrices


def test_usd_per_million_tokens_by_hand():
    assert usd_per_million_tokens(2.0, 1, 3600, 1_000_000) == pytest.approx(2.0)  # $2 for an hour, 1M tokens
    assert usd_per_million_tokens(4.0, 2, 1800, 2_000_000) == pytest.approx(2.0)  # 4*2*0.5 h = $4, 2M tokens
    assert usd_per_million_tokens(3.0, 1, 0.0, 0) == 0.0  # nothing ran: nothing spent
    assert math.isinf(usd_per_million_tokens(3.0, 1, 60.0, 0))  # paid for a minute, served nothing


def test_api_cost_by_hand():
    assert api_cost_usd(1_000_000, 500_000, 0.15, 0.60) == pytest.approx(0.15 + 0.30)


def summary(**changes) -> dict:
    base = {"completed": 100, "duration_s": 3600.0, "total_input_tokens": 100_000, "total_output_tokens": 20_000,
            "utilisation": 0.5}
    return base | changes


def test_cost_summary_by_hand():
    prices = ApiPrices(0.15, 0.60, "2024-07", "test")
    c = cost_summary(summary(), 3.6, 1, prices)
    assert c["fleet_usd"] == pytest.approx(3.6)
    assert c["usd_per_1m_output_tokens"] == pytest.approx(3.6 / 0.02)
    assert c["usd_per_1m_total_tokens"] == pytest.approx(3.6 / 0.12)
    api = 0.1 * 0.15 + 0.02 * 0.60  # = 0.027
    assert c["api_usd"] == pytest.approx(api)
    assert c["self_hosted_over_api"] == pytest.approx(3.6 / api)
    # $3.6/h = $0.001/s; the API charges 0.027/100 = $0.00027 per request -> break even at 3.7037 req/s
    assert c["break_even_request_rate"] == pytest.approx(0.001 / 0.00027)
    assert c["break_even_traffic_share"] == pytest.approx(3.6 / api)


def test_missing_prices_give_no_dollar_figures():
    c = cost_summary(summary(), None, 2)
    assert c["fleet_usd"] is None and c["usd_per_1m_output_tokens"] is None
    c = cost_summary(summary(), 1.0, 1, ApiPrices())
    assert "api_usd" not in c


def test_meets_slo_and_fewest_replicas():
    assert meets_slo({"p99_ttft_ms": 300.0}, {"p99_ttft_ms": 300})
    assert not meets_slo({"p99_ttft_ms": 301.0}, {"p99_ttft_ms": 300})
    calls = []

    def simulate(n):
        calls.append(n)
        return {"p99_ttft_ms": 1000.0 / n}

    n, s = fewest_replicas(simulate, {"p99_ttft_ms": 300})
    assert n == 4 and s["p99_ttft_ms"] == 250.0  # 1000/3 = 333 fails, 1000/4 = 250 passes
    assert len(calls) == len(set(calls))  # each count simulated once
    assert fewest_replicas(simulate, {"p99_ttft_ms": 1}, max_replicas=8) is None
    calls.clear()
    assert fewest_replicas(simulate, {"p99_ttft_ms": 300}, start=8)[0] == 4  # passes at 8: bisect below
    assert fewest_replicas(simulate, {"p99_ttft_ms": 60}, start=3)[0] == 17  # fails at 3: double up, bisect
