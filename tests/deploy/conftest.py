"""The deploy suites' shared fixtures: the images are built once per test session (scripts/build_images.sh,
engine + Prometheus + the case app images) and every compose test starts its stack from them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.deploy.docker_helpers import engine_problem, require, run

# Every case whose app image a compose suite needs; build_images.sh builds the engine image once for all.
CASES = ("rag_chatbot", "batch_summarisation", "multilora")


def _image_cache(env: dict) -> Path:
    return Path(env.get("SHARED_ENGINE_IMAGE_CACHE") or Path(
        env.get("SHARED_ENGINE_CACHE") or Path.home() / ".cache" / "shared_engine") / "images")


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """ENGINE_IMAGE, PROMETHEUS_IMAGE and <CASE>_APP_IMAGE names, with `build_s` the time the build took
    (seconds, as a string: the dict is merged into compose's environment). Skips or fails as `require`."""
    require(engine_problem())
    env = dict(os.environ)
    names: dict[str, str] = {}
    start = time.monotonic()
    for case in CASES:  # the engine image and wheelhouse are cached: later cases only add their app layer
        out = run(["bash", "scripts/build_images.sh", "--base", "local", "--case", case], env, timeout=1500)
        assert out.returncode == 0, f"build_images.sh failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        names.update(line.split("=", 1) for line in (_image_cache(env) / "images.env").read_text().split())
    names["build_s"] = f"{time.monotonic() - start:.1f}"
    return names
