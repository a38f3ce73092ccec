"""`local_server`: `python -m shared_engine serve` on 127.0.0.1 (a free port, the default model) for the
reliability scripts, stopped on exit; or a server that is already running (`url`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:] if log else ''}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout_s:.0f} s")


@contextlib.contextmanager
def local_server(flags: list[str], url: str | None = None, log_path: Path | None = None,
                 startup_s: float = 300) -> Iterator[str]:
    """Yields the base URL. With `url` given, only checks that it is healthy."""
    if url:
        wait_healthy(url, None, 30)
        yield url
        return
    port = free_port()
    log_path = log_path or Path(tempfile.mkdtemp(prefix="reliability-")) / f"server-{port}.log"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "shared_engine", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--uvicorn-log-level", "warning", *flags]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, startup_s, log_path)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
