"""The load test's locust users, for a few seconds against the gateway and the fake engine: both kinds of users
send, each request is one JSON line with its tenant and status, the whale over its quota gets 429s (counted
as refusals, not failures), and the well-behaved tenants follow the Zipf order (tenant 1 the busiest)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from case_multilora.app.server import create_app
from case_multilora.app.settings import GatewaySettings
from case_multilora.app.tenants import Tenant, TenantRegistry, key_digest
from case_multilora.loadtest.zipf import zipf_choice
from tests.server.uvicorn_thread import serve_in_thread

pytestmark = pytest.mark.timeout(120)


def test_zipf_choice_is_true_zipf():
    import random

    rng = random.Random(0)
    counts = collections.Counter(zipf_choice(rng, 6, 1.1) for _ in range(20_000))
    weights = [(k + 1) ** -1.1 for k in range(6)]
    for k in range(6):
        assert counts[k] / 20_000 == pytest.approx(weights[k] / sum(weights), abs=0.015)


def test_locust_run_writes_samples_and_whales_hit_their_quota(fake_engine, tmp_path):
    _, engine_url = fake_engine
    names = ["t1", "t2", "t3", "w1"]
    registry = TenantRegistry([Tenant(n, key_digest(f"k-{n}"), "upper", request_limit="6/minute")
                               if n == "w1" else Tenant(n, key_digest(f"k-{n}"), "upper") for n in names])
    spec = {"well_behaved": [{"name": n, "key": f"k-{n}", "quota_per_minute": 6} for n in names[:3]],
            "whales": [{"name": "w1", "key": "k-w1", "quota_per_minute": 60}]}  # sends 10/s; the gateway allows 6/min
    (tmp_path / "tenants.json").write_text(json.dumps(spec))
    samples = tmp_path / "samples.jsonl"
    app = create_app(GatewaySettings(engine_url=engine_url), registry)
    with serve_in_thread(app) as url:
        out = subprocess.run(
            [sys.executable, "-m", "locust", "-f", "case_multilora/loadtest/locustfile.py", "--headless", "-u", "5",
             "-r", "50", "-t", "6s", "--host", url, "--ml-tenants", str(tmp_path / "tenants.json"),
             "--ml-samples", str(samples), "--ml-pacing-s", "0.05", "--ml-whale-users", "2",
             "--ml-burst-period-s", "60", "--only-summary"],
            env={**os.environ, "ML_WHALE_USERS_TOTAL": "2"}, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    by_kind = collections.Counter((r["kind"], r["status"]) for r in rows)
    assert by_kind[("whale", 200)] == 6 and by_kind[("whale", 429)] >= 1, by_kind
    wb = [r for r in rows if r["kind"] == "well-behaved"]
    assert wb and all(r["status"] == 200 and r["ttft_s"] > 0 and r["completion_tokens"] == 3 for r in wb)
    per_tenant = collections.Counter(r["tenant"] for r in wb)
    assert per_tenant["t1"] > per_tenant["t3"], per_tenant
