"""handed.md K14: a client that disconnects mid-prefill must not leave its prefill running. A server whose step
budget is 16 tokens prefills a ~1,300-token prompt over ~80 steps; the client goes away once the prefill has
started (the prompt-token counter moved), streamed or not. The request is aborted within a few steps: the
prefill tokens processed stay well below the prompt, no request runs and no KV block is held afterwards, and the
next request is served. Counted in prefill tokens (`vllm:prompt_tokens_total`), not in wall time."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.server.conftest import _stop, start_server

PROMPT = " ".join(f"item{i} costs {i % 7} coins;" for i in range(160))  # ~1,300 tokens


@pytest.fixture(scope="module")
def chunked_server(tmp_path_factory, default_model_dir):
    proc, srv = start_server(tmp_path_factory.mktemp("chunked-server"), "--max-model-len", "2048",
                             "--max-num-batched-tokens", "16", "--max-num-seqs", "4")
    yield srv
    _stop(proc)


def _until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _send(server, body: dict) -> socket.socket:
    """The request on a raw socket (closing it is a real disconnect, whatever a client library pools)."""
    payload = json.dumps(body).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (host.encode(), len(payload)) + payload)
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_mid_prefill_stops_the_prefill(chunked_server, tokenizer, stream):
    server = chunked_server
    prompt_len = len(tokenizer(PROMPT)["input_ids"])
    assert prompt_len > 800
    before = server.metric("vllm:prompt_tokens_total")
    sock = _send(server, {"model": server.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                          "stream": stream})
    assert _until(lambda: server.metric("vllm:prompt_tokens_total") - before >= 48, 60), "prefill never started"
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-prefill
    sock.close()
    assert _until(lambda: server.metric("vllm:num_requests_running") == 0
                  and server.metric("vllm:num_requests_waiting") == 0, 30)
    processed = server.metric("vllm:prompt_tokens_total") - before
    assert processed < prompt_len // 2, (processed, prompt_len)  # stopped, not run to the end
    assert _until(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0, 10)
    r = server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
