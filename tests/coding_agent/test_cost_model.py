"""The cost model's arithmetic on hand-made sweeps: the largest passing session count, distrust above the
first failure, GPUs rounded up at 10x, $ per session-hour, and a sweep where nothing passes."""

from __future__ import annotations

import pytest

from case_coding_agent.cost_model import fleet, misses, model, sessions_per_gpu

TARGETS = {"p99_warm_ttft_ms": 1000, "min_turns2plus_hit_rate": 0.97, "concurrent_sessions": 16}


def run(n, ttft, hit, ceiling=1.0):
    return {"sessions": n, "summary": {"p99_warm_ttft_ms": ttft, "turns2plus_hit_rate": hit,
                                       "turns2plus_hit_rate_ceiling": ceiling}}


def test_misses_names_each_slo():
    assert misses(run(1, 900, 0.98)["summary"], TARGETS) == []
    missed = misses(run(1, 1200, 0.9)["summary"], TARGETS)
    assert len(missed) == 2 and "1200" in missed[0] and "0.9" in missed[1]
    assert misses({"p99_warm_ttft_ms": None, "turns2plus_hit_rate": 0.99}, TARGETS)  # no data is no pass
    during = {"p99_warm_ttft_ms": 500, "p99_warm_ttft_during_cold_ms": 1500, "turns2plus_hit_rate": 0.99}
    assert misses(during, TARGETS) == ["p99 warm TTFT during a cold prefill 1500 ms > 1000 ms"]
    relative = {"p99_warm_ttft_ms": 1000, "min_turns2plus_hit_share_of_ceiling": 0.97}
    assert misses(run(1, 900, 0.92, ceiling=0.94)["summary"], relative) == []  # 0.92 >= 0.97 x 0.94
    assert "ceiling 0.94" in misses(run(1, 900, 0.90, ceiling=0.94)["summary"], relative)[0]


def test_sessions_per_gpu_is_the_largest_pass_below_the_first_failure():
    sweep = [run(24, 1500, 0.98), run(8, 300, 0.99), run(16, 800, 0.98), run(32, 700, 0.99)]
    per_gpu, fail = sessions_per_gpu(sweep, TARGETS)
    assert per_gpu == 16 and fail["sessions"] == 24  # 32 passing after 24 failed is not trusted
    assert sessions_per_gpu([run(8, 2000, 0.99)], TARGETS)[0] == 0
    with pytest.raises(ValueError, match="no runs"):
        sessions_per_gpu([], TARGETS)


def test_fleet_rounds_gpus_up_and_prices_session_hours():
    f = fleet(160, 24, 4.0)
    assert f["gpus"] == 7 and f["usd_per_hour"] == 28.0 and f["usd_per_session_hour"] == round(28 / 160, 4)
    assert fleet(16, 16, 4.0)["gpus"] == 1
    with pytest.raises(ValueError, match="no session count"):
        fleet(16, 0, 4.0)


def test_model_scales_the_brief_tenfold():
    report = {"command": "c", "commit": "x", "gpu": "H200",
              "sweep": [run(8, 300, 0.99), run(16, 800, 0.98), run(24, 1500, 0.98)]}
    out = model(report, TARGETS, 4.0)
    assert out["sessions_per_gpu"] == 16 and out["usd_per_session_hour_at_capacity"] == 0.25
    assert out["brief"]["gpus"] == 1 and out["at_10x"]["gpus"] == 10 and out["at_10x"]["concurrent_sessions"] == 160
    assert out["next_bottleneck"]["missed"] == ["p99 warm TTFT 1500 ms > 1000 ms"]
