"""An SLO-search probe stops early only when its SLO is certainly missed, so the search finds the same answer."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np
import pytest

from shared_engine.config import EngineConfig
from shared_engine.sim import Simulator, WorkloadSpec, load_hardware
from shared_engine.sim.cost import fewest_replicas
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.slo_watch import SloWatch


def fake_request(ttft_s: float, e2el_s: float, num_output: int):
    return SimpleNamespace(arrival_time=10.0, first_token_time=10.0 + ttft_s, finished_time=10.0 + e2el_s,
                           num_output_tokens=num_output)


@pytest.mark.parametrize("stat, q", [("median", 50), ("p90", 90), ("p99", 99)])
def test_stop_only_when_the_percentile_is_over_the_limit(stat, q):
    rng = random.Random(q)
    outcomes = set()
    for _ in range(300):
        max_requests = rng.randint(1, 300)
        n = rng.randint(1, max_requests)  # fewer may finish than were planned
        ttfts = [rng.choice([0.1, 0.2, 0.3]) + rng.random() * rng.choice([0.0, 1e-9, 0.5]) for _ in range(n)]
        limit_ms = rng.choice([200.0, 300.0, 450.0])
        watch = SloWatch({f"{stat}_ttft_ms": limit_ms, "mean_ttft_ms": 0.0}, max_requests)
        stopped = any([watch.missed(fake_request(t, t + 1.0, 5)) for t in ttfts])
        if stopped:
            assert 1000.0 * np.percentile(ttfts, q) > limit_ms
        outcomes.add(stopped)
    assert outcomes == {True, False}


def test_tpot_and_e2el_are_watched_as_the_summary_computes_them():
    # p99 of at most 200 values: 200 - floor(0.99 * 199) = 3 values over the limit decide it, plus one
    watch = SloWatch({"p99_tpot_ms": 10.0, "p99_e2el_ms": 1e9}, max_requests=200)
    assert not watch.missed(fake_request(0.5, 10.0, 1))  # one output token: no TPOT
    assert not watch.missed(fake_request(0.5, 0.6, 20))  # 0.1 / 19 s per token: under the limit
    assert [watch.missed(fake_request(0.5, 10.0, 20)) for _ in range(4)] == [False, False, False, True]
    assert not SloWatch({"mean_ttft_ms": 1.0, "p99_itl_ms": 1.0}, 10).active  # nothing decidable early


def test_search_finds_the_same_replica_count_and_summary():
    _, arch = resolve_arch("qwen3-0.6b")
    sim = Simulator(EngineConfig.from_flat(max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=2048), arch,
                    load_hardware("L4"))
    spec = WorkloadSpec.from_dict({"name": "busy", "seed": 1, "num_requests": 240,
                                   "arrival": {"process": "poisson", "rate": 200},
                                   "prompt_len": {"dist": "uniform", "min": 100, "max": 800},
                                   "output_len": {"dist": "uniform", "min": 20, "max": 80}})
    slo = {"p99_ttft_ms": 100, "p90_e2el_ms": 1500}
    full, early = [], []

    def simulate_full(n):
        full.append(n)
        return sim.run_replicas(spec, n).summary()

    def simulate_early(n):
        metrics = sim.run_replicas(spec, n, stop_on_slo_miss=slo)
        early.append((n, metrics.slo_missed))
        return None if metrics.slo_missed else metrics.summary()

    expected = fewest_replicas(simulate_full, slo)
    assert expected[0] > 2  # the search has failing probes to stop
    assert fewest_replicas(simulate_early, slo) == expected
    assert [n for n, _ in early] == full and any(missed for _, missed in early)
    one = sim.run_replicas(dataclasses.replace(spec, num_requests=None, duration_s=2.0), 1, stop_on_slo_miss=slo)
    assert not one.slo_missed  # unknown request count: never stopped
