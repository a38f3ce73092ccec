"""K11 (handed.md H21) and the issue's abort check: clients that go away have their requests aborted
within a step, their KV blocks freed, and the next request is served at once."""

from __future__ import annotations

import time

import httpx


def _wait_idle(server, baseline: float, within_s: float = 2.0) -> float:
    deadline = time.monotonic() + within_s
    while True:
        running = server.metric("vllm:num_requests_running")
        usage = server.metric("vllm:kv_cache_usage_perc")
        if running == 0 and usage <= baseline + 1e-9:
            return time.monotonic()
        assert time.monotonic() < deadline, f"running={running} kv_usage={usage} baseline={baseline}"
        time.sleep(0.05)


def _open_and_close_stream(server, path: str, body: dict) -> None:
    with httpx.Client(timeout=60) as client, client.stream("POST", server.url + path, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # close after the first chunk


def test_50_streams_closed_after_first_chunk(server):
    baseline = server.metric("vllm:kv_cache_usage_perc")
    body = {"prompt": "Write a very long essay about the history of Rome.", "max_tokens": 900,
            "ignore_eos": True, "stream": True}
    for _ in range(50):
        _open_and_close_stream(server, "/v1/completions", body)
    _wait_idle(server, baseline)


def test_h21_stream_and_non_stream_drops(server):
    baseline = server.metric("vllm:kv_cache_usage_perc")
    chat = {"messages": [{"role": "user", "content": "Write a very long essay about Rome."}], "max_tokens": 900,
            "ignore_eos": True}
    for _ in range(50):
        _open_and_close_stream(server, "/v1/chat/completions", {**chat, "stream": True})
        try:
            httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=0.1)
        except httpx.TimeoutException:
            pass  # dropped after 100 ms
        else:
            raise AssertionError("a 900-token request finished within 100 ms")
    _wait_idle(server, baseline)
    started = time.monotonic()
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200 and time.monotonic() - started < 2.0
    assert server.metric("vllm:num_requests_waiting") == 0
