"""The gateway against a fake engine (fake_engine.py), both on real uvicorn servers: what reaches the engine
(the tenant's adapter, cache salt, tenant and priority, whatever the client sent), the OpenAI error envelope
for every refusal (401, 400, 413, 429 with Retry-After, 502, the engine's own errors passed on), and the
per-tenant metrics."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.multilora.conftest import auth

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def metric(url: str, name: str, **labels) -> float:
    """The sample `name` with `labels` from the gateway's /metrics (0 when absent)."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def sse_chunks(text: str) -> list:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_the_engine_gets_the_tenants_adapter_salt_and_tenant_whatever_the_client_sends(gateway):
    _, url, engine = gateway
    forged = {**CHAT, "model": "french", "cache_salt": "someone-else", "tenant": "beta", "priority": -5}
    a = httpx.post(url + "/v1/chat/completions", json=forged, headers=auth("alpha")).json()
    b = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("beta")).json()
    a2 = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=auth("alpha")).json()
    model_a, tenant_a, salt_a = a["choices"][0]["message"]["content"].split("|")
    model_b, tenant_b, salt_b = b["choices"][0]["message"]["content"].split("|")
    assert (model_a, tenant_a, model_b, tenant_b) == ("upper", "alpha", "french", "beta")
    assert salt_a != salt_b and salt_a != "someone-else" and salt_a.startswith("t-")
    assert a2["choices"][0]["text"].split("|")[2] == salt_a  # one salt per tenant: its requests share blocks
    assert [body["priority"] for body in engine.state.bodies] == [0, 1, 0]
    assert engine.state.bodies[1]["max_tokens"] == 4


def test_a_missing_max_tokens_gets_the_default(gateway):
    _, url, engine = gateway
    httpx.post(url + "/v1/chat/completions", json={"messages": CHAT["messages"]}, headers=auth("alpha"))
    assert engine.state.bodies[-1]["max_tokens"] == 64


@pytest.mark.parametrize("headers,status", [({}, 401), ({"Authorization": "Bearer sk-nobody"}, 401),
                                            ({"Authorization": "Basic sk-alpha"}, 401)])
def test_unknown_keys_get_401_in_the_envelope(gateway, headers, status):
    _, url, engine = gateway
    r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == status
    assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["code"] == 401
    assert engine.state.bodies == []


@pytest.mark.parametrize("content,param", [(b"{not json", None), (b"[1, 2]", None),
                                           (json.dumps({**CHAT, "max_tokens": 0}).encode(), "max_tokens"),
                                           (json.dumps({**CHAT, "stream": "yes"}).encode(), "stream"),
                                           (json.dumps({**CHAT, "n": -1}).encode(), "n")])
def test_bad_bodies_get_400_naming_the_field(gateway, content, param):
    _, url, engine = gateway
    r = httpx.post(url + "/v1/chat/completions", content=content, headers=auth("alpha"))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    assert engine.state.bodies == []


def test_a_body_over_the_limit_gets_413(gateway):
    _, url, _ = gateway
    big = {"messages": [{"role": "user", "content": "x" * (1 << 20)}]}
    assert httpx.post(url + "/v1/chat/completions", json=big, headers=auth("alpha")).status_code == 413


def test_request_limit_429_with_retry_after_and_counted(gateway):
    _, url, engine = gateway
    small = {**CHAT, "max_tokens": 1}
    codes = [httpx.post(url + "/v1/chat/completions", json=small, headers=auth("tight")).status_code
             for _ in range(3)]
    assert codes == [200, 200, 429]
    r = httpx.post(url + "/v1/chat/completions", json=small, headers=auth("tight"))
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.json()["error"] == {**r.json()["error"], "type": "rate_limit_exceeded", "param": "requests",
                                 "code": 429}
    assert len(engine.state.bodies) == 2
    assert metric(url, "gateway_rate_limited_total", tenant="tight", limit="requests") == 2
    assert metric(url, "gateway_requests_total", tenant="tight", status="429") == 2
    # another tenant is not affected
    assert httpx.post(url + "/v1/chat/completions", json=small, headers=auth("alpha")).status_code == 200


def test_token_limit_reserves_max_tokens(gateway):
    _, url, _ = gateway
    r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 250}, headers=auth("tight"))
    assert r.status_code == 200
    r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 100}, headers=auth("tight"))
    assert r.status_code == 429 and r.json()["error"]["param"] == "tokens" and int(r.headers["Retry-After"]) >= 1
    r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 400}, headers=auth("tight"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"  # can never fit the window


def test_stream_relays_chunks_and_hides_the_usage_chunk_unless_asked(gateway):
    _, url, _ = gateway
    body = {**CHAT, "stream": True, "fake_chunks": 4}
    plain = sse_chunks(httpx.post(url + "/v1/chat/completions", json=body, headers=auth("alpha")).text)
    assert plain[-1] == "[DONE]" and len(plain) == 5
    assert all(json.loads(c)["usage"] is None for c in plain[:-1])
    asked = {**body, "stream_options": {"include_usage": True}}
    chunks = sse_chunks(httpx.post(url + "/v1/chat/completions", json=asked, headers=auth("alpha")).text)
    assert len(chunks) == 6 and json.loads(chunks[-2])["choices"] == []
    assert metric(url, "gateway_generation_tokens_total", tenant="alpha") == 8  # both streams' usage counted
    assert metric(url, "gateway_prompt_tokens_total", tenant="alpha") == 14
    assert metric(url, "gateway_cached_prompt_tokens_total", tenant="alpha") == 32
    assert metric(url, "gateway_time_to_first_token_seconds_count", tenant="alpha") == 2
    assert metric(url, "gateway_requests_in_flight", tenant="alpha") == 0


def test_engine_errors_are_passed_on_and_release_the_slot(gateway):
    app, url, _ = gateway
    for status in (400, 404, 503):
        r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "fake_status": status}, headers=auth("slow"))
        assert r.status_code == status and r.json()["error"]["code"] == status
    assert r.headers["Retry-After"] == "3"
    assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("slow")).status_code == 200
    assert metric(url, "gateway_requests_in_flight", tenant="slow") == 0


def test_an_engine_dying_mid_stream_ends_it_with_an_error_frame_and_releases(gateway):
    _, url, _ = gateway
    body = {**CHAT, "stream": True, "fake_chunks": 5, "fake_die_after": 2}
    chunks = sse_chunks(httpx.post(url + "/v1/chat/completions", json=body, headers=auth("slow")).text)
    assert len(chunks) == 3 and json.loads(chunks[-1])["error"]["code"] == 502
    assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("slow")).status_code == 200


def test_an_unreachable_engine_is_a_502_and_releases(tmp_path):
    from case_multilora.app.server import create_app
    from case_multilora.app.settings import GatewaySettings
    from tests.deploy.docker_helpers import free_port
    from tests.multilora.conftest import tenants
    from tests.server.uvicorn_thread import serve_in_thread

    app = create_app(GatewaySettings(engine_url=f"http://127.0.0.1:{free_port()}"), tenants())
    with serve_in_thread(app) as url:
        for _ in range(2):  # max_concurrency 1: the second would be a 429 if the first had kept its slot
            r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("slow"))
            assert r.status_code == 502 and r.json()["error"]["type"] == "bad_gateway_error"
        assert httpx.get(url + "/health").status_code == 503


def test_models_lists_only_the_tenants_adapter(gateway):
    _, url, _ = gateway
    assert [m["id"] for m in httpx.get(url + "/v1/models", headers=auth("beta")).json()["data"]] == ["french"]
    assert httpx.get(url + "/v1/models").status_code == 401
