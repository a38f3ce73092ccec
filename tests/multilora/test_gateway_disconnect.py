"""Concurrency slots: a tenant at its `max_concurrency` gets 429 (param `concurrency`, Retry-After), and the
slot comes back when the holder's client disconnects mid-stream (the gateway also closes the engine stream,
which is how the engine learns to abort the request)."""

from __future__ import annotations

import time

import httpx

from tests.multilora.conftest import auth
from tests.multilora.test_gateway import CHAT, metric

SLOW = {**CHAT, "stream": True, "fake_chunks": 200, "fake_delay_s": 0.05}


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_disconnect_releases_the_concurrency_slot(gateway):
    _, url, engine = gateway
    with httpx.Client(timeout=30) as client, client.stream("POST", url + "/v1/chat/completions", json=SLOW,
                                                           headers=auth("slow")) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator closes the connection
        assert next(lines).startswith("data: ")  # the first chunk arrived: the request is in flight
        second = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("slow"))
        assert second.status_code == 429 and second.json()["error"]["param"] == "concurrency"
        assert second.headers["Retry-After"] == "1"
        assert metric(url, "gateway_requests_in_flight", tenant="slow") == 1
        # another tenant has its own slots
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("alpha")).status_code == 200
    # leaving the block closed the connection mid-stream
    assert wait_for(lambda: metric(url, "gateway_requests_in_flight", tenant="slow") == 0)
    assert wait_for(lambda: engine.state.open_streams == 0 and engine.state.closed_streams >= 1)
    assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=auth("slow")).status_code == 200
    assert metric(url, "gateway_rate_limited_total", tenant="slow", limit="concurrency") == 1
