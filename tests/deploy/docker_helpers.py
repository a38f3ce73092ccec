"""Shared by the compose tests: is Docker (engine and compose v2) usable here, and the skip-or-fail rule.

Without Docker the tests skip, unless SHARED_ENGINE_REQUIRE_DOCKER=1 (set by scripts/ci/setup_docker.sh on CI
machines), in which case they fail: a broken set-up must not pass as a skip."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
