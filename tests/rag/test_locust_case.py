"""The case's locustfile, headless, against the engine directly (`--rag-target engine`: the app's system
prompt and prompt builder, no retrieval): no failures, and TTFT and ITL rows of their own in the CSV."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "case_rag_chatbot" / "loadtest"))

from engine_server import EngineServer  # noqa: E402


@pytest.mark.slow
def test_locust_users_report_ttft_and_itl_rows(tmp_path):
    exe = shutil.which("locust", path=str(Path(sys.executable).parent)) or shutil.which("locust")
    if exe is None:
        pytest.skip("locust is not installed")
    with EngineServer(None, {"max_model_len": 1024}, [], tmp_path / "server.log") as server:
        prefix = tmp_path / "locust"
        cmd = [exe, "-f", str(REPO / "case_rag_chatbot/loadtest/locustfile.py"), "--headless", "-u", "2", "-r", "2",
               "-t", "25s", "--host", server.url, "--csv", str(prefix), "--only-summary", "--stop-timeout", "60",
               "--rag-target", "engine", "--think-time-mean-s", "0.5", "--max-tokens", "6",
               "--system-prompt-tokens", "256"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader(Path(f"{prefix}_stats.csv").read_text().splitlines()))
    by_type = {(r["Type"], r["Name"]): r for r in rows}
    assert proc.returncode == 0, out
    assert all(int(r["Failure Count"]) == 0 for r in rows), rows
    for kind in ("POST", "TTFT", "ITL"):
        assert int(by_type[(kind, "/v1/chat/completions")]["Request Count"]) > 0, rows
