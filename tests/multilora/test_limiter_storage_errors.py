"""K15: a limits storage that fails after the concurrency slot was taken (Redis timing out on the request or
token window) gives the slot back, and the gateway answers a 503 envelope with Retry-After instead of a bare
500. Before, only a `GatewayError` released the slot: one storage hiccup between the two calls locked a
`max_concurrency: 1` tenant out until the slot counter's TTL (15 minutes by default)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from limits.aio.storage import MemoryStorage

from case_multilora.app.limiter import TenantLimiter
from case_multilora.app.server import create_app
from case_multilora.app.settings import GatewaySettings
from case_multilora.app.tenants import Tenant, TenantRegistry, key_digest
from tests.server.uvicorn_thread import serve_in_thread

KEY = "sk-one"
ONE = Tenant("one", key_digest(KEY), "acme", request_limit="100/minute", token_limit="10000/minute",
             max_concurrency=1)
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


class FlakyWindows(MemoryStorage):
    """Memory storage whose moving windows raise `ConnectionError` while `failing` names their kind."""

    failing: str | None = None

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if self.failing is not None and f"/{self.failing}/" in key:
            raise ConnectionError("redis: timed out")
        return await super().acquire_entry(key, limit, expiry, amount)


@pytest.mark.parametrize("kind", ["requests", "tokens"])
def test_a_storage_error_after_the_slot_gives_the_slot_back(kind):
    async def run():
        storage = FlakyWindows()
        limiter = TenantLimiter(storage)
        storage.failing = kind
        with pytest.raises(ConnectionError):
            await limiter.acquire(ONE, 10)
        assert await limiter.in_flight(ONE) == 0
        storage.failing = None
        lease = await limiter.acquire(ONE, 10)  # not a 429 for concurrency: the slot came back
        assert await limiter.in_flight(ONE) == 1
        await lease.release()
        assert await limiter.in_flight(ONE) == 0

    asyncio.run(run())


def test_the_gateway_answers_503_and_the_tenant_is_not_locked_out(fake_engine):
    engine_app, engine_url = fake_engine
    storage = FlakyWindows()
    limiter = TenantLimiter(storage)
    app = create_app(GatewaySettings(engine_url=engine_url), TenantRegistry([ONE]), limiter)
    headers = {"Authorization": f"Bearer {KEY}"}
    with serve_in_thread(app) as url:
        storage.failing = "requests"
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "service_unavailable_error" and err["code"] == 503 and r.headers["Retry-After"]
        assert engine_app.state.bodies == []
        storage.failing = None
        for _ in range(2):  # max_concurrency 1: each would be a 429 if a slot had leaked
            r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 200, r.text
        assert len(engine_app.state.bodies) == 2
