"""`scripts/bench_serving.py` prints the vLLM-style block and writes the results JSON; a headless locust run
(20 users, 60 s) has no failures and TTFT / ITL rows in its CSV."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bench_serving_smoke(server, tmp_path):
    result = tmp_path / "bench.json"
    cmd = [sys.executable, "scripts/bench_serving.py", "--base-url", server.url, "--dataset-name", "random",
           "--num-prompts", "6", "--random-input-len", "16", "--random-output-len", "6", "--request-rate", "20",
           "--burstiness", "1", "--max-concurrency", "4", "--result-file", str(result)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for label in ("Serving Benchmark Result", "Successful requests:", "Benchmark duration (s):",
                  "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
                  "Output token throughput (tok/s):", "Total Token throughput (tok/s):", "Mean TTFT (ms):",
                  "Median TPOT (ms):", "P99 ITL (ms):", "Mean E2EL (ms):"):
        assert label in proc.stdout, proc.stdout
    data = json.loads(result.read_text())
    assert data["completed"] == 6 and data["failed"] == 0 and data["total_input_tokens"] == 6 * 16
    assert data["total_output_tokens"] == 6 * 6
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_e2el_ms", "hardware",
                "commit", "engine_config", "model", "config"):
        assert key in data, key


def test_bench_serving_prefix_repetition(server, tmp_path):
    cmd = [sys.executable, "scripts/bench_serving.py", "--base-url", server.url, "--dataset-name",
           "prefix_repetition", "--num-prompts", "4", "--prefix-repetition-prefix-len", "32",
           "--prefix-repetition-suffix-len", "8", "--prefix-repetition-num-prefixes", "2",
           "--prefix-repetition-output-len", "4"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Successful requests:                     4" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_locust_headless_20_users(server, tmp_path):
    exe = shutil.which("locust", path=str(Path(sys.executable).parent)) or shutil.which("locust")
    if exe is None:
        pytest.skip("locust is not installed")
    prefix = tmp_path / "locust"
    cmd = [exe, "-f", str(REPO / "scripts/locust_chat.py"), "--headless", "-u", "20", "-r", "10", "-t", "60s",
           "--host", server.url, "--csv", str(prefix), "--only-summary", "--stop-timeout", "30"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=200, env=env)
    rows = list(csv.DictReader(Path(f"{prefix}_stats.csv").read_text().splitlines()))
    by_type = {(r["Type"], r["Name"]): r for r in rows}
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    assert int(by_type[("POST", "/v1/chat/completions")]["Request Count"]) > 0, out
    assert all(int(r["Failure Count"]) == 0 for r in rows), rows
    for kind in ("TTFT", "ITL"):
        assert int(by_type[(kind, "/v1/chat/completions")]["Request Count"]) > 0, rows
