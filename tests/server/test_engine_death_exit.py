"""A dead engine stops `serve` (engine_watchdog.py), so that compose's `restart:` or Kubernetes restarts it:
the engine core SIGKILLed mid-stream, the stream ends with an error frame, /health answers 503, then the
server process exits with status 1 (reliability/faults.py measures the restart under compose)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from shared_engine.entrypoints.openai.engine_watchdog import exit_when_dead
from tests.server.conftest import start_server


class _FakeEngine:
    healthy = True
    error = None


def test_watchdog_stops_only_after_the_engine_dies_and_the_grace():
    engine, stopped = _FakeEngine(), []

    async def scenario():
        task = asyncio.create_task(exit_when_dead(engine, lambda: stopped.append(time.monotonic()), 0.3, 0.01))
        await asyncio.sleep(0.2)
        assert not stopped  # a healthy engine is never stopped
        engine.healthy, engine.error, died = False, RuntimeError("core gone"), time.monotonic()
        await asyncio.wait_for(task, 5)
        return died

    died = asyncio.run(scenario())
    assert len(stopped) == 1 and stopped[0] - died >= 0.3


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").glob("*/children") for c in task.read_text().split()]


def _engine_core_pid(pid: int) -> int:
    for child in _children(pid):
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return child
    raise AssertionError(f"no engine core among {_children(pid)}")


def test_serve_exits_after_its_engine_core_is_killed(tmp_path, default_model_dir):
    proc, server = start_server(tmp_path, "--max-model-len", "1024")
    try:
        frames: list[str] = []
        first = threading.Event()
        body = {"prompt": "Write a very long essay about Rome.", "max_tokens": 900, "ignore_eos": True, "stream": True}
        reader = threading.Thread(target=lambda: _read(server.url, body, frames, first), daemon=True)
        reader.start()
        assert first.wait(60)
        os.kill(_engine_core_pid(proc.pid), signal.SIGKILL)
        reader.join(60)
        errors = [json.loads(f)["error"] for f in frames if f.startswith('{"error"')]
        assert errors and "engine" in errors[0]["message"] and errors[0]["code"] == 503, frames[-3:]
        assert len(frames) >= 2 and frames[-1] == "[DONE]", frames[-3:]  # mid-stream: text first, then the error
        statuses = []
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                statuses.append(httpx.get(server.url + "/health", timeout=2).status_code)
            time.sleep(0.05)
        assert 503 in statuses and 200 not in statuses[statuses.index(503):], statuses
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _read(url: str, body: dict, frames: list[str], first: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(line[6:])
                first.set()
