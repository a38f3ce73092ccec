"""Auth on every route that reveals or costs something (/metrics and /health open by default,
configurable), /version without local paths, and request-head limits (431 for a 16 MB header or 20,000
headers) through a real uvicorn with httptools and with h11, on the tiny dummy-weight model."""

from __future__ import annotations

import select
import socket
import time

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.http_limits import uvicorn_http_options
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app
from tests.server.uvicorn_thread import serve_in_thread

AUTH = {"Authorization": "Bearer sekret"}
PROTECTED = [("post", "/v1/completions", {"prompt": [5, 6], "max_tokens": 1}), ("get", "/v1/models", None),
             ("post", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
             ("post", "/tokenize", {"prompt": "x"}), ("post", "/detokenize", {"tokens": [5]}),
             ("get", "/version", None), ("get", "/openapi.json", None)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                            num_gpu_blocks_override=64))


async def _call(client, method, path, body, headers=None):
    if method == "get":
        return await client.get(path, headers=headers)
    return await client.post(path, json=body, headers=headers)


def test_api_key_protects_every_route_but_health_and_metrics(engine):
    app = create_app(engine, ServerConfig(api_key="sekret"))

    async def scenario(client):
        for method, path, body in PROTECTED:
            for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                r = await _call(client, method, path, body, headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.json()["error"]["type"] == "authentication_error"
            r = await _call(client, method, path, body, AUTH)
            assert r.status_code != 401, (path, r.text)
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.post("/v1/completions", json=PROTECTED[0][2], headers=AUTH)).status_code == 200

    run_app(app, scenario)


def test_health_and_metrics_can_require_the_key(engine):
    app = create_app(engine, ServerConfig(api_key="sekret", api_key_exempt_paths="/health"))

    async def scenario(client):
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=AUTH)).status_code == 200

    run_app(app, scenario)


def test_version_reveals_no_local_paths(engine, tiny_model_dir):
    app = create_app(engine)

    async def scenario(client):
        return (await client.get("/version")).json()

    body = run_app(app, scenario)
    config = body["engine_config"]
    assert config["model"] == tiny_model_dir.name and config["max_num_seqs"] == engine.config.scheduler.max_num_seqs
    assert str(tiny_model_dir.parent) not in str(body)


def _send_head(url: str, pieces) -> tuple[bytes, int]:
    """Send a request head piece by piece, stopping once the server answers; (its answer, bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    answer, sent = b"", 0
    try:
        for piece in pieces:
            if select.select([sock], [], [], 0)[0]:
                break
            sock.sendall(piece)
            sent += len(piece)
        while chunk := sock.recv(65536):
            answer += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    return answer, sent


def _big_header(size: int):
    yield b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
    for _ in range(size // 65536):
        yield b"a" * 65536
    yield b"\r\n\r\n"


def _many_headers(count: int):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"  # 2 headers, then `count` more
    yield head + b"".join(b"X-%d: v\r\n" % i for i in range(count)) + b"\r\n"


@pytest.fixture(scope="module", params=["httptools", "h11"])
def served(engine, request):
    config = ServerConfig()
    options = uvicorn_http_options(config.max_header_bytes, config.max_headers, httptools=request.param == "httptools")
    if request.param == "httptools":
        pytest.importorskip("httptools")
        assert options["http"] != "httptools" and not isinstance(options["http"], str)
    with serve_in_thread(create_app(engine, config), **options) as url:
        yield request.param, url


def test_a_16_mb_header_is_refused_early(served):
    kind, url = served
    answer, sent = _send_head(url, _big_header(16 * 1024 * 1024))
    assert sent < 16 * 1024 * 1024, sent  # refused before the whole header arrived
    status = b"431" if kind == "httptools" else b"400"
    assert answer.startswith(b"HTTP/1.1 " + status) or answer == b"", answer[:200]
    ok, _ = _send_head(url, _big_header(16 * 1024))
    assert ok.startswith(b"HTTP/1.1 200"), ok[:200]


@pytest.mark.parametrize("count, status", [(20_000, None), (100, b"431"), (98, b"200")])
def test_header_count(served, count, status):
    kind, url = served
    answer, _ = _send_head(url, _many_headers(count))
    if status is None:  # 20,000 headers pass the byte limit first
        status = b"431" if kind == "httptools" else b"400"
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


def test_serve_enforces_the_head_limits(server):
    """`serve` itself (run_server's uvicorn options), not only an app served here: a 64 KB header gets 431."""
    import importlib.util

    answer, _ = _send_head(server.url, _big_header(64 * 1024))
    status = b"431" if importlib.util.find_spec("httptools") else b"400"  # h11's own cap answers 400
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert server.get("/health").status_code == 200


def test_serve_closes_a_slow_request_head(server):
    """`serve` passes the read deadlines to uvicorn: a head trickled past --header-read-timeout-s (default
    10 s) gets 408 and the connection is closed (tests/server/test_slowloris.py has the details)."""
    host, port = server.url.removeprefix("http://").split(":")
    limit = ServerConfig().header_read_timeout_s
    with socket.create_connection((host, int(port)), timeout=limit + 10) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        answer = sock.recv(65536)
        seconds = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408") and limit * 0.9 <= seconds < limit + 5, (answer[:100], seconds)
    assert server.get("/health").status_code == 200
