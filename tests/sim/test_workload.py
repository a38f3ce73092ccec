"""Workload generation: arrival processes, shared prefixes that the prefix cache can find, sessions."""

from __future__ import annotations

import numpy as np
import pytest

from shared_engine.sim.distributions import Distribution
from shared_engine.sim.workload import WorkloadGenerator
from shared_engine.sim.workload_spec import WorkloadSpec


def drain(gen: WorkloadGenerator, finish_after: float = 1.0) -> list:
    """Pop every request, finishing each `finish_after` s after arrival with 3 dummy output tokens."""
    issued = []
    while gen.peek_time() != float("inf"):
        now = gen.peek_time()
        for spec in gen.pop_due(now):
            issued.append(spec)
            gen.on_finish(spec, [0, 0, 0], now + finish_after)
    return issued


def test_poisson_rate_and_count():
    spec = WorkloadSpec.from_dict({"num_requests": 4000, "arrival": {"process": "poisson", "rate": 8.0}})
    issued = drain(WorkloadGenerator(spec, vocab_size=1000, max_model_len=4096))
    assert len(issued) == 4000
    gaps = np.diff([r.arrival_time for r in issued])
    assert np.mean(gaps) == pytest.approx(1 / 8.0, rel=0.06)


def test_gamma_burstiness_raises_gap_variance():
    def cv(burstiness):
        spec = WorkloadSpec.from_dict({"num_requests": 3000,
                                       "arrival": {"process": "gamma", "rate": 4.0, "burstiness": burstiness}})
        gaps = np.diff([r.arrival_time for r in drain(WorkloadGenerator(spec, 1000, 4096))])
        return np.std(gaps) / np.mean(gaps)

    assert cv(0.25) > 1.5 > cv(1.0) > 0.8


def test_shared_system_prompt_and_growing_sessions():
    spec = WorkloadSpec.from_dict({
        "num_requests": 30, "arrival": {"process": "poisson", "rate": 1.0},
        "prompt_len": 20, "output_len": 3,
        "prefix": {"system_prompt_len": 64, "turns_per_session": 3, "think_time_s": 2.0},
    })
    issued = drain(WorkloadGenerator(spec, 1000, 4096))
    system = issued[0].prompt_token_ids[:64]
    assert all(r.prompt_token_ids[:64] == system for r in issued)
    by_session = {}
    for r in issued:
        by_session.setdefault(id(r.session), []).append(r)
    turns = next(t for t in by_session.values() if len(t) == 3)
    first, second = turns[0], turns[1]
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + 3] == first.prompt_token_ids + [0, 0, 0]
    assert len(second.prompt_token_ids) == len(first.prompt_token_ids) + 3 + 20
    assert second.arrival_time == pytest.approx(first.arrival_time + 1.0 + 2.0)


def test_closed_loop_keeps_at_most_num_users_in_flight():
    spec = WorkloadSpec.from_dict({"num_requests": 200, "arrival": {"process": "closed_loop", "num_users": 5,
                                                                   "think_time_s": 0.5}})
    issued = drain(WorkloadGenerator(spec, 1000, 4096), finish_after=2.0)
    assert len(issued) == 200
    times = sorted(r.arrival_time for r in issued)
    for t in times:  # requests in flight at t: arrived in (t - 2, t]
        assert sum(1 for u in times if t - 2.0 < u <= t) <= 5


def test_replicas_split_the_requests():
    spec = WorkloadSpec.from_dict({"num_requests": 101, "arrival": {"process": "poisson", "rate": 10.0}})
    counts = [len(drain(WorkloadGenerator(spec, 1000, 4096, r, 4))) for r in range(4)]
    assert sum(counts) == 101 and max(counts) - min(counts) <= 1


def test_adapters_and_context_limit():
    spec = WorkloadSpec.from_dict({"num_requests": 300, "prompt_len": 500, "output_len": 100,
                                   "adapters": {"num_adapters": 5, "popularity": "zipf", "zipf_s": 1.5},
                                   "arrival": {"process": "poisson", "rate": 10}})
    issued = drain(WorkloadGenerator(spec, 1000, max_model_len=400))
    names = [r.lora_name for r in issued]
    assert names.count("adapter-0") > names.count("adapter-4")
    assert all(len(r.prompt_token_ids) + r.max_tokens <= 400 for r in issued)


def test_distribution_validation_names_the_problem():
    with pytest.raises(ValueError, match="needs"):
        Distribution.parse({"dist": "uniform", "min": 3})
    with pytest.raises(ValueError, match="dist must be one of"):
        Distribution.parse({"dist": "pareto"})
    with pytest.raises(ValueError, match="unknown workload key"):
        WorkloadSpec.from_dict({"num_requests": 1, "arival": {}})
    with pytest.raises(ValueError, match="unknown slo key"):
        WorkloadSpec.from_dict({"num_requests": 1, "slo": {"p99_ttft": 1}})
    random = Distribution.parse({"dist": "random", "mean": 100, "range_ratio": 0.5})
    lengths = random.sample(np.random.default_rng(0), 500)
    assert lengths.min() >= 50 and lengths.max() <= 150


@pytest.mark.parametrize("spec, integer", [
    ({"dist": "uniform", "min": 5, "max": 9}, True),
    ({"dist": "random", "mean": 100, "range_ratio": 0.5}, True),
    ({"dist": "normal", "mean": 3, "std": 2, "min": 1.5, "max": 4.5}, True),  # clipping and half-to-even
    ({"dist": "lognormal", "mean": 50, "sigma": 1.0, "max": 80}, True),
    ({"dist": "exponential", "mean": 2}, False),
    ({"dist": "exponential", "mean": 2, "min": 1, "max": 3}, False),
    ({"dist": "choice", "values": [0.5, 1.5, 2.5, 7], "weights": [1, 2, 3, 4]}, True),
    ({"dist": "fixed", "value": 0.2}, True),
])
def test_sample_one_is_sample_of_one(spec, integer):
    """The workload's scalar draws (`sample_one`) equal `sample(rng, 1)[0]` and leave the same rng state."""
    dist = Distribution.parse(spec, integer=integer)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(300):
        expected = dist.sample(rng_a, 1)[0]
        value = dist.sample_one(rng_b)
        assert value == expected and type(value) is (int if integer else float)
    assert rng_a.random() == rng_b.random()
