"""`case_rag_chatbot/cost_model.py` runs in under 30 s with no GPU, and its figures hold what must hold."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cost_model_runs_under_30s_and_is_sane(tmp_path):
    out = tmp_path / "cost.json"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "case_rag_chatbot/cost_model.py", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert elapsed < 30, f"cost_model.py took {elapsed:.1f} s"
    assert "modelled, not measured" in proc.stdout
    report = json.loads(out.read_text())
    gpus = {g["gpu"]: g for g in report["gpus"]}
    assert set(gpus) == {"H200", "H100 SXM", "L4"}, gpus.keys()
    for g in gpus.values():
        assert "error" not in g, g
        one, ten = g["scales"]["1x"], g["scales"]["10x"]
        assert ten["users"] == 10 * one["users"] == 2000
        assert ten["replicas"] > one["replicas"] >= 1  # no replica holds 2,000 users
        assert one["replicas"] * g["users_per_replica"] >= one["users"]
        assert g["at_capacity"]["prefix_cache_hit_rate"] > 0.5  # the 4k system prompt is shared
        assert one["usd_per_1m_output_tokens"] > 0
    # Same compute, more memory bandwidth and KV room: an H200 replica holds at least an H100's users.
    assert gpus["H200"]["users_per_replica"] >= gpus["H100 SXM"]["users_per_replica"]
    # One decode step reads all 16 GB of weights: at 300 GB/s the L4 cannot make a 25 ms ITL at any scale.
    assert not gpus["L4"]["itl_target_feasible"] and gpus["L4"]["decode_floor_ms"] > 25
    assert gpus["H200"]["itl_target_feasible"]
