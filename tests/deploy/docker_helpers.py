"""Shared by the compose tests: is Docker (engine and compose v2) usable here, and the skip-or-fail rule.

Without Docker the tests skip, unless SHARED_ENGINE_REQUIRE_DOCKER=1 (set by scripts/ci/setup_docker.sh on CI
machines), in which case they fail: a broken set-up must not pass as a skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE_DOCKER = os.environ.get("SHARED_ENGINE_REQUIRE_DOCKER") == "1"


def compose_problem() -> str | None:
    """Why `docker compose` (the CLI and its v2 plugin, no engine needed) cannot run, or None."""
    if shutil.which("docker") is None:
        return "docker CLI not installed"
    out = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not out.stdout.strip().lstrip("v").startswith("2"):
        return f"docker compose v2 not available: {out.stderr.strip() or out.stdout.strip()}"
    return None


def engine_problem() -> str | None:
    """Why no Docker engine answers, or None."""
    problem = compose_problem()
    if problem:
        return problem
    out = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                         timeout=30)
    return None if out.returncode == 0 else f"no Docker engine answers: {out.stderr.strip()[:200]}"


def require(problem: str | None) -> None:
    if problem is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"SHARED_ENGINE_REQUIRE_DOCKER=1 but {problem}")
    pytest.skip(problem)


def run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`cmd` in the repository root, output captured."""
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def compose_stack(compose_file: Path, env: dict, timings: dict[str, float], wait_timeout_s: int = 600):
    """`docker compose up -d --wait` of `compose_file` under a project of its own; yields the compose
    command prefix. Always torn down (volumes included), its last log lines printed for a failing test;
    `timings["up_s"]` is the time `up` took."""
    project = f"shared-engine-test-{compose_file.parent.name}-{os.getpid()}".lower().replace("_", "-")
    compose = ["docker", "compose", "-f", str(compose_file), "-p", project]
    try:
        start = time.monotonic()
        up = run([*compose, "up", "-d", "--wait", "--wait-timeout", str(wait_timeout_s)], env,
                 timeout=wait_timeout_s + 60)
        timings["up_s"] = round(time.monotonic() - start, 1)
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-2000:]}\n{up.stderr[-2000:]}"
        yield compose
    finally:
        logs = run([*compose, "logs", "--no-color", "--tail", "60"], env, timeout=60)
        print(logs.stdout[-6000:], logs.stderr[-2000:], file=sys.stderr)  # shown when a test failed
        down = run([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "20"], env, timeout=180)
        print(f"compose timings ({compose_file.parent.name}): {timings}", file=sys.stderr)
        assert down.returncode == 0, down.stderr
