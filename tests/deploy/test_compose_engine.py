"""The bare engine under Docker compose, end to end, as CI runs it.

The `images` fixture (conftest.py: scripts/build_images.sh, once per session for every compose suite) builds the
CPU image on a local Debian base (no registry here; the wheelhouse and the base are cached under
$SHARED_ENGINE_CACHE/images, so repeated runs only rebuild the project's own layer),
`docker compose up --wait` starts deploy/docker-compose.yaml (the default model converted into a fresh volume,
the engine, Prometheus) on free loopback ports, a chat completion returns real text, and Prometheus answers
PromQL for `vllm:num_requests_waiting` and a TTFT quantile. Everything is torn down, volumes included, also
when a step fails. Skips without Docker unless SHARED_ENGINE_REQUIRE_DOCKER=1, then fails.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.deploy.docker_helpers import REPO, compose_stack, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

COMPOSE_FILE = REPO / "deploy" / "docker-compose.yaml"
MODEL = "SmolLM2-135M-Instruct"  # served_model_name in deploy/config.yaml
TTFT_QUERY = ('histogram_quantile(0.9, sum by (le) '
              f'(rate(vllm:time_to_first_token_seconds_bucket{{model_name="{MODEL}"}}[1m])))')
WAITING_QUERY = f'vllm:num_requests_waiting{{model_name="{MODEL}"}}'


@dataclass
class Stack:
    engine: str       # http://127.0.0.1:PORT
    prometheus: str   # http://127.0.0.1:PORT
    timings: dict[str, float]


@pytest.fixture(scope="module")
def stack(images):
    env = {**os.environ, **images,
           "ENGINE_PORT": str(free_port()), "PROMETHEUS_PORT": str(free_port())}
    timings = {"build_s": float(images["build_s"])}
    with compose_stack(COMPOSE_FILE, env, timings):
        yield Stack(f"http://127.0.0.1:{env['ENGINE_PORT']}", f"http://127.0.0.1:{env['PROMETHEUS_PORT']}",
                    timings)


def promql(stack: Stack, query: str) -> list[dict]:
    r = httpx.get(f"{stack.prometheus}/api/v1/query", params={"query": query}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def chat(stack: Stack, content: str, max_tokens: int) -> str:
    r = httpx.post(f"{stack.engine}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0.0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_chat_completion_through_compose_returns_real_text(stack):
    assert httpx.get(f"{stack.engine}/health", timeout=10).status_code == 200
    text = chat(stack, "What is the capital of France? Answer in one sentence.", 32)
    assert "Paris" in text, text


def test_prometheus_scrapes_queue_and_ttft(stack):
    """Prometheus (scraping every 5 s) answers the KEDA query and a TTFT quantile. The rate() needs two
    scrapes around a request, so requests keep coming until the quantile is a number (bounded: 120 s)."""
    deadline = time.monotonic() + 120
    waiting, ttft = [], float("nan")
    while time.monotonic() < deadline:
        chat(stack, "Say hello.", 4)
        time.sleep(5)
        waiting = promql(stack, WAITING_QUERY)
        result = promql(stack, TTFT_QUERY)
        ttft = float(result[0]["value"][1]) if result else float("nan")
        if waiting and math.isfinite(ttft):
            break
    assert waiting and waiting[0]["metric"]["model_name"] == MODEL, waiting
    assert float(waiting[0]["value"][1]) >= 0
    assert math.isfinite(ttft) and 0 < ttft < 60, ttft
    targets = httpx.get(f"{stack.prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
