"""The multi-LoRA case under Docker compose, end to end: case_multilora/docker-compose.yaml (the default model
converted into a fresh volume, the engine with the committed trained adapters and the fix's config, the gateway
with its limits in Redis, Redis, Prometheus) from the session's images (conftest.py), on free loopback ports,
with two tenants on different adapters and two on one adapter (tests/multilora/data/tenants_compose.yaml):

- each tenant's greedy answer equals its golden one (case_multilora/golden.json);
- a document umbrella sent is in the cache for umbrella, and hooli (same adapter) gets cached_tokens 0 for it;
- the tight tenant's 4th request in a minute is a 429 with Retry-After in the OpenAI envelope (counted in Redis);
- its one concurrency slot, held by a stream, is released when that client disconnects;
- Prometheus scrapes the engine and the gateway, whose metrics carry the tenant label.

Torn down, volumes included, also when a step fails. Skips without Docker unless SHARED_ENGINE_REQUIRE_DOCKER=1,
then fails.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from tests.deploy.docker_helpers import REPO, compose_stack, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

COMPOSE_FILE = REPO / "case_multilora" / "docker-compose.yaml"
TENANTS = REPO / "tests" / "multilora" / "data" / "tenants_compose.yaml"
DOCUMENT = ("Read this note and answer the question after it. The warehouse on the north side keeps the spare "
            "pumps, the valves and the seals; the one on the south side keeps the pipes. ") * 3


def chat(url: str, tenant: str, content: str, max_tokens: int = 24, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer sk-{tenant}-demo"},
                      json={"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                            "temperature": 0.0, **extra})


@pytest.fixture(scope="module")
def stack(images):
    ports = {name: str(free_port()) for name in ("ENGINE_PORT", "GATEWAY_PORT", "REDIS_PORT", "PROMETHEUS_PORT")}
    env = {**os.environ, **images, **ports, "TENANTS_FILE": str(TENANTS)}
    timings = {"build_s": float(images["build_s"])}
    with compose_stack(COMPOSE_FILE, env, timings):
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}


def test_golden_answers_per_tenant(stack):
    golden = json.loads((REPO / "case_multilora" / "golden.json").read_text())["tenants"]
    for tenant in ("acme", "initech", "umbrella", "hooli"):
        case = golden[tenant]
        r = chat(stack["GATEWAY_PORT"], tenant, case["question"], case["max_tokens"])
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == case["answer"], tenant


def test_another_tenant_on_the_same_adapter_gets_no_cached_tokens(stack):
    url = stack["GATEWAY_PORT"]
    cached = lambda tenant: httpx.post(  # a raw completion: a chat template's system block would be shared
        url + "/v1/completions", timeout=300, headers={"Authorization": f"Bearer sk-{tenant}-demo"},
        json={"prompt": DOCUMENT + "Where are the pipes?", "max_tokens": 2}).json()["usage"][
        "prompt_tokens_details"]["cached_tokens"]
    first, again = cached("umbrella"), cached("umbrella")
    assert first == 0 and again >= 48, (first, again)
    assert cached("hooli") == 0


def test_concurrency_slot_released_after_a_disconnect(stack):
    """tight has one slot (counted in Redis): a second request while a stream holds it is a 429; once that
    client disconnects the slot is back (and the engine aborted the request)."""
    url = stack["GATEWAY_PORT"]
    in_flight = lambda: 'gateway_requests_in_flight{tenant="tight"} 1.0' in httpx.get(url + "/metrics").text
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a dog."}], "max_tokens": 200,
            "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-tight-demo"}) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator closes the connection
        assert next(lines).startswith("data: ")
        refused = chat(url, "tight", "Hi", 1)
        assert refused.status_code == 429 and refused.json()["error"]["param"] == "concurrency", refused.text
        assert in_flight()
    deadline = time.monotonic() + 30
    while in_flight() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not in_flight()
    assert chat(url, "tight", "Hi", 1).status_code == 200  # the slot is free again
    engine = httpx.get(stack["ENGINE_PORT"] + "/metrics", timeout=30).text
    running = [line for line in engine.splitlines() if line.startswith("vllm:num_requests_running")]
    assert running and all(line.endswith(" 0.0") for line in running), running


def test_rate_limit_429_with_retry_after_through_redis(stack):
    """tight's 3 requests a minute: the previous test used 2 (the one refused for concurrency took none)."""
    codes = [chat(stack["GATEWAY_PORT"], "tight", "Hi", 1) for _ in range(2)]
    assert [r.status_code for r in codes] == [200, 429], [r.text for r in codes]
    r = codes[1]
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.json()["error"] == {**r.json()["error"], "type": "rate_limit_exceeded", "param": "requests",
                                 "code": 429}


def test_prometheus_scrapes_engine_and_gateway(stack):
    deadline = time.monotonic() + 60
    while True:
        targets = httpx.get(f"{stack['PROMETHEUS_PORT']}/api/v1/targets", timeout=30).json()
        health = sorted((t["labels"]["job"], t["health"]) for t in targets["data"]["activeTargets"])
        if health == [("gateway", "up"), ("shared-engine", "up")] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert health == [("gateway", "up"), ("shared-engine", "up")], targets
    while True:  # the targets may be up before a scrape that saw the earlier tests' requests (CI, 2 busy cores)
        query = httpx.get(f"{stack['PROMETHEUS_PORT']}/api/v1/query", timeout=30,
                          params={"query": 'gateway_requests_total{tenant="acme",status="200"}'}).json()
        if query["data"]["result"] or time.monotonic() > deadline + 30:
            break
        time.sleep(2)
    assert query["data"]["result"] and float(query["data"]["result"][0]["value"][1]) >= 1, query
