"""The RAG chatbot case under Docker compose, end to end: case_rag_chatbot/docker-compose.yaml (the default
model converted into a fresh volume, the engine, a Chroma server, the RAG app, Prometheus) started from the
session's images (conftest.py), on free loopback ports, with the CPU profile's engine config; a short system
prompt (its title block, ~134 tokens) and ten topics of the corpus keep the run short. A question through the
app's HTTP API (`POST /chat`) streams an answer with its sources (the page that holds the answer among them);
a second question reuses the system prompt from the engine's prefix cache; Prometheus scrapes the engine.
Torn down, volumes included, also when a step fails. Skips without Docker unless
SHARED_ENGINE_REQUIRE_DOCKER=1, then fails.
"""

from __future__ import annotations

import os
import time

import httpx
import pytest

from case_rag_chatbot.app.client import ask
from tests.deploy.docker_helpers import REPO, compose_stack, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

COMPOSE_FILE = REPO / "case_rag_chatbot" / "docker-compose.yaml"
# A small corpus (48 chunks of ten statements' topics) keeps the app's ingest at startup to seconds.
TOPICS = "pass,import,assert,raise,del,global,return,for,try,with"
SYSTEM_PROMPT_TOKENS = 192  # the policy's title block alone: ~134 tokens (the smallest budget that fits)


@pytest.fixture(scope="module")
def rag_stack(images):
    ports = {name: str(free_port()) for name in ("ENGINE_PORT", "CHROMA_PORT", "APP_PORT", "PROMETHEUS_PORT")}
    env = {**os.environ, **images, **ports, "ENGINE_CONFIG": "./the_fix/config_cpu.yaml",
           "SYSTEM_PROMPT_TOKENS": str(SYSTEM_PROMPT_TOKENS), "RAG_MAX_TOKENS": "16", "RAG_CORPUS_TOPICS": TOPICS}
    timings = {"build_s": float(images["build_s"])}
    with compose_stack(COMPOSE_FILE, env, timings):
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}


def test_question_through_the_app_returns_an_answer_with_sources(rag_stack):
    app = rag_stack["APP_PORT"]
    health = httpx.get(f"{app}/health", timeout=10).json()
    assert health == {**health, "status": "ok", "num_chunks": 48}, health  # ingested into the Chroma server
    answer = ask(app, "What does the pass statement do?", timeout_s=300, max_tokens=16)
    assert answer.error is None, answer.error
    assert answer.text.strip() and answer.num_token_events >= 2, answer
    assert [s["n"] for s in answer.sources] == [1, 2, 3, 4], answer.sources
    assert any(s["source"].endswith("/reference/simple_stmts.html#pass") for s in answer.sources), answer.sources
    usage = answer.done["usage"]
    assert 1 <= usage["completion_tokens"] <= 16 and usage["prompt_tokens"] > 134, usage
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0, usage  # the engine's first request: cold

    second = ask(app, "How do I import a module under a different name?", timeout_s=300, max_tokens=4)
    assert second.error is None and second.sources, second
    # the shared system prompt's full 16-token blocks come from the engine's prefix cache
    cached = second.done["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 128 and cached % 16 == 0, second.done


def test_prometheus_scrapes_the_case_engine(rag_stack):
    """The scrape target answers once Prometheus has scraped it (every 5 s; bounded: 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        targets = httpx.get(f"{rag_stack['PROMETHEUS_PORT']}/api/v1/targets", timeout=10).json()
        health = [t["health"] for t in targets["data"]["activeTargets"]]
        if health == ["up"] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert health == ["up"], targets
