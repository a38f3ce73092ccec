"""Slowloris: read deadlines for the request head and body, and the connection cap (http_deadlines.py),
through a real uvicorn with httptools and with h11, on the tiny dummy-weight model with 0.6 s deadlines.
Slow connections are closed with a 408 envelope within the deadline; a request that takes longer than the
deadlines to answer, a keep-alive connection used twice, and normal requests beside the slow ones are
served."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.http_limits import uvicorn_http_options
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.uvicorn_thread import serve_in_thread

DEADLINE_S = 0.6
CONFIG = ServerConfig(header_read_timeout_s=DEADLINE_S, body_read_timeout_s=DEADLINE_S, max_connections=12)
BODY = {"prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64))
    app = create_app(engine, CONFIG)

    @app.get("/test-slow-answer")
    async def slow_answer():  # answers after 3 deadlines: processing time is not a slow client
        await asyncio.sleep(3 * DEADLINE_S)
        return {"ok": True}

    return app


@pytest.fixture(scope="module", params=["httptools", "h11"])
def url(app, request):
    if request.param == "httptools":
        pytest.importorskip("httptools")
    options = uvicorn_http_options(CONFIG.max_header_bytes, CONFIG.max_headers, httptools=request.param == "httptools",
                                   limits=CONFIG.connection_limits)
    with serve_in_thread(app, **options) as base:
        yield base


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _trickle_until_closed(sock: socket.socket, first: bytes, every_s: float = 0.1, limit_s: float = 8.0):
    """Send `first`, then one byte every `every_s` until the server answers or closes; (answer, seconds)."""
    start = time.monotonic()
    sock.sendall(first)
    sock.settimeout(every_s)
    answer = b""
    while time.monotonic() - start < limit_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        answer += chunk
    return answer, time.monotonic() - start


def _status_and_error(answer: bytes) -> tuple[bytes, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)["error"]


@pytest.mark.parametrize("kind, first", [
    ("head", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "),
    ("body", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n{"),
])
def test_a_slow_head_or_body_is_closed_at_the_deadline(url, kind, first):
    with _connect(url) as sock:
        answer, seconds = _trickle_until_closed(sock, first)
    assert DEADLINE_S * 0.9 <= seconds < DEADLINE_S + 2.0, seconds
    status, error = _status_and_error(answer)
    assert status == b"HTTP/1.1 408 Request Timeout" and error["code"] == 408 and kind in error["message"], answer
    assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 200


def test_a_silent_connection_is_closed(url):
    with _connect(url) as sock:
        start = time.monotonic()
        answer = sock.recv(65536)
        seconds = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408") and seconds < DEADLINE_S + 2.0, (answer, seconds)


def test_slow_processing_and_keep_alive_are_not_cut(url):
    with httpx.Client(base_url=url, timeout=30) as client:
        slow = client.get("/test-slow-answer")
        time.sleep(DEADLINE_S / 3)  # idle on the kept-alive connection, within the head deadline
        again = client.post("/v1/completions", json=BODY)
        streamed = client.post("/v1/completions", json={**BODY, "stream": True})
    assert slow.status_code == 200 and slow.json() == {"ok": True}
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")


def test_slow_connections_do_not_stop_normal_requests(url):
    socks = [_connect(url) for _ in range(6)]
    try:
        for i, s in enumerate(socks):
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else
                      b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        for _ in range(3):
            assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 200
        time.sleep(DEADLINE_S + 0.5)
        for s in socks:  # every one answered 408 and closed by now
            s.settimeout(2)
            assert s.recv(65536).startswith(b"HTTP/1.1 408")
    finally:
        for s in socks:
            s.close()


def test_connections_past_the_cap_get_503(url):
    cap = CONFIG.max_connections
    time.sleep(DEADLINE_S + 0.5)  # earlier tests' connections are closed
    socks = [_connect(url) for _ in range(cap)]
    try:
        time.sleep(0.2)
        with _connect(url) as extra:
            extra.settimeout(5)
            answer = extra.recv(65536)
        status, error = _status_and_error(answer)
        assert status == b"HTTP/1.1 503 Service Unavailable" and error["code"] == 503, answer
        assert b"retry-after: 1" in answer.lower()
    finally:
        for s in socks:
            s.close()
    time.sleep(0.2)
    assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 200
