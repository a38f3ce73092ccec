"""The case's locust user against a stand-in OpenAI server (stdlib HTTP, SSE): every turn of a session
carries the same X-Session-Id, resends the previous turn's prompt plus the next append (the trace's prompt
texts), asks for the trace's output length, and the CSV has TTFT, ITL and CACHED% rows."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO / "case_coding_agent" / "loadtest" / "locustfile.py"


class StandIn(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.seen.append((self.headers.get("X-Session-Id"), body))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in ("a", "b", "c"):
            self.wfile.write(f'data: {json.dumps({"choices": [{"text": text}], "usage": None})}\n\n'.encode())
        usage = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 80}}
        self.wfile.write(f'data: {json.dumps({"choices": [], "usage": usage})}\n\ndata: [DONE]\n\n'.encode())

    def log_message(self, *args):
        pass


def test_agent_sessions_resend_a_growing_context_under_one_session_id(tmp_path):
    exe = shutil.which("locust", path=str(Path(sys.executable).parent)) or shutil.which("locust")
    if exe is None:
        pytest.skip("locust is not installed")
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prefix = tmp_path / "agent"
    try:
        cmd = [exe, "-f", str(LOCUSTFILE), "--headless", "-u", "2", "-r", "2", "-t", "6s", "--host",
               f"http://127.0.0.1:{server.server_address[1]}", "--csv", str(prefix), "--only-summary",
               "--pause-scale", "0", "--max-turns", "3"]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_session: dict[str, list[dict]] = {}
    for session_id, body in StandIn.seen:
        by_session.setdefault(session_id, []).append(body)
    complete = [b for b in by_session.values() if len(b) == 3]
    assert len(complete) >= 2, {k: len(v) for k, v in by_session.items()}
    for bodies in complete:
        for a, b in zip(bodies, bodies[1:]):
            assert b["prompt"].startswith(a["prompt"]) and len(b["prompt"]) > len(a["prompt"])
        assert all(b["stream"] and b["ignore_eos"] and b["max_tokens"] >= 16 for b in bodies)
    assert None not in by_session
    rows = {r["Type"]: r for r in csv.DictReader(Path(f"{prefix}_stats.csv").read_text().splitlines())}
    for kind in ("POST", "TTFT", "ITL", "CACHED%"):
        assert int(rows[kind]["Request Count"]) > 0 and int(rows[kind]["Failure Count"]) == 0, rows
    assert float(rows["CACHED%"]["Average Response Time"]) == pytest.approx(80.0)
