"""The gateway while whales hold many streams: a well-behaved request does not wait for an engine connection
behind them (the pool is larger than all open streams; a pool of exactly the open streams does make it
wait, which is what this test would catch), and the relay (relay.py) parses only the chunks it needs,
relays the rest byte for byte, and keeps the usage, error and first-token bookkeeping of the per-line relay
it replaced."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from case_multilora.app import relay as relay_module
from case_multilora.app.relay import SseRelay
from case_multilora.app.server import create_app
from case_multilora.app.settings import GatewaySettings
from tests.multilora.conftest import auth, tenants
from tests.server.uvicorn_thread import serve_in_thread

pytestmark = pytest.mark.timeout(120)

WHALE = {"messages": [{"role": "user", "content": "doc"}], "max_tokens": 8, "stream": True,
         "fake_chunks": 2, "fake_delay_s": 30}  # the first chunk at once, then the stream stays open
LIGHT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def light_request_while_whales_stream(url: str, engine_app, whales: int, wait_s: float) -> float | None:
    """Seconds for one light request while `whales` streams are open (None: not answered within `wait_s`)."""
    limits = httpx.Limits(max_connections=whales + 8, max_keepalive_connections=whales + 8)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        opened = asyncio.Event()
        count = [0]

        async def whale() -> None:
            async with client.stream("POST", "/v1/chat/completions", json=WHALE, headers=auth("alpha")) as r:
                first = True
                async for line in r.aiter_lines():
                    if first and line.startswith("data: "):
                        first, count[0] = False, count[0] + 1
                        if count[0] == whales:
                            opened.set()

        tasks = [asyncio.create_task(whale()) for _ in range(whales)]
        try:
            await asyncio.wait_for(opened.wait(), 30)
            assert engine_app.state.open_streams == whales
            start = time.perf_counter()
            try:
                r = await client.post("/v1/chat/completions", json=LIGHT, headers=auth("beta"), timeout=wait_s)
            except httpx.TimeoutException:
                return None
            assert r.status_code == 200, r.text
            return time.perf_counter() - start
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def test_a_light_request_is_not_queued_behind_many_open_whale_streams(fake_engine):
    engine_app, engine_url = fake_engine
    whales = 128  # above httpx's default pool of 100 connections
    with serve_in_thread(create_app(GatewaySettings(engine_url=engine_url), tenants())) as url:
        took = asyncio.run(light_request_while_whales_stream(url, engine_app, whales, wait_s=10))
    assert took is not None and took < 5, took


def test_a_pool_no_larger_than_the_open_streams_makes_the_light_request_wait(fake_engine):
    """The failure the test above guards against: every engine connection held by a whale stream."""
    engine_app, engine_url = fake_engine
    settings = GatewaySettings(engine_url=engine_url, engine_max_connections=16)
    with serve_in_thread(create_app(settings, tenants())) as url:
        took = asyncio.run(light_request_while_whales_stream(url, engine_app, 16, wait_s=1.5))
    assert took is None


def chunk(content: str | None = None, usage: dict | None = None, choices: bool = True) -> bytes:
    body = {"id": "x", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}] if choices else [],
            "usage": usage}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def stream_bytes(n: int = 50) -> bytes:
    return (chunk("") + b"".join(chunk(f' "t{i}" error usage') for i in range(n)) + chunk(usage=USAGE, choices=False)
            + b"data: [DONE]\n\n")


def relay_all(data: bytes, pieces: int, wants_usage: bool) -> tuple[bytes, SseRelay, list]:
    firsts = []
    relay = SseRelay(wants_usage, lambda: firsts.append(1))
    size = -(-len(data) // pieces)
    out = b"".join(relay.feed(data[i:i + size]) for i in range(0, len(data), size)) + relay.close()
    return out, relay, firsts


@pytest.mark.parametrize("pieces", [1, 7, 400])
def test_the_relay_passes_tokens_byte_for_byte_and_drops_the_unasked_usage_chunk(pieces):
    data = stream_bytes()
    out, relay, firsts = relay_all(data, pieces, wants_usage=False)
    assert out == data.replace(chunk(usage=USAGE, choices=False), b"")
    assert relay.usage == USAGE and relay.status is None and firsts == [1]
    out, relay, _ = relay_all(data, pieces, wants_usage=True)
    assert out == data and relay.usage == USAGE


def test_the_relay_parses_only_until_the_first_token_and_the_usage_chunk(monkeypatch):
    parsed = []
    real = relay_module.json.loads
    monkeypatch.setattr(relay_module.json, "loads", lambda s: parsed.append(s) or real(s))
    out, relay, firsts = relay_all(stream_bytes(200), 1, wants_usage=False)
    assert firsts == [1] and relay.usage == USAGE
    assert len(parsed) <= 3, len(parsed)  # role chunk, first token, usage: not one parse per token
    out, relay, _ = relay_all(stream_bytes(200), 300, wants_usage=False)
    assert len(parsed) <= 3 + 2 + 5, len(parsed)  # small reads: still only the blocks that need it


def test_the_relay_nulls_usage_on_a_token_chunk_and_reads_errors_crlf_and_other_lines():
    with_usage = chunk("a") + chunk("b", usage=USAGE)
    out, relay, _ = relay_all(with_usage, 1, wants_usage=False)
    assert json.loads(out.split(b"\n\n")[1][6:])["usage"] is None and relay.usage == USAGE
    error = b'data: {"error": {"message": "x", "code": 503}}\n\n'
    out, relay, _ = relay_all(chunk("a") + error, 3, wants_usage=False)
    assert relay.status == "503" and out.endswith(error)
    crlf = (chunk("a") + b": keep-alive\n\nevent: x\n" + chunk("b")).replace(b"\n", b"\r\n")
    out, _, firsts = relay_all(crlf, 5, wants_usage=False)
    assert out == chunk("a") + chunk("b") and firsts == [1]
    out, _, _ = relay_all(chunk("a") + chunk("b")[:-2], 1, wants_usage=False)  # the last event's blank line missing
    assert out == chunk("a") + chunk("b")
