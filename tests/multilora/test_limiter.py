"""TenantLimiter on its own (memory storage): the order of the checks and what a refusal costs."""

from __future__ import annotations

import asyncio

import pytest

from case_multilora.app.errors import GatewayError
from case_multilora.app.limiter import TenantLimiter, storage_from_uri
from case_multilora.app.tenants import Tenant, key_digest

TENANT = Tenant("t", key_digest("k"), "a", request_limit="2/minute", token_limit="100/minute", max_concurrency=1)


def test_a_concurrency_refusal_takes_nothing_from_the_windows():
    async def run():
        limiter = TenantLimiter(storage_from_uri("memory://"))
        held = await limiter.acquire(TENANT, 40)
        for _ in range(5):
            with pytest.raises(GatewayError) as e:
                await limiter.acquire(TENANT, 40)
            assert e.value.status == 429 and e.value.param == "concurrency"
        await held.release()
        await held.release()  # idempotent: the slot count does not go below zero
        assert await limiter.in_flight(TENANT) == 0
        second = await limiter.acquire(TENANT, 40)  # request 2 of 2, tokens 80 of 100
        await second.release()
        with pytest.raises(GatewayError) as e:
            await limiter.acquire(TENANT, 10)
        assert e.value.param == "requests" and 1 <= int(e.value.headers["Retry-After"]) <= 60
        assert await limiter.in_flight(TENANT) == 0  # a rate refusal gives its slot back

    asyncio.run(run())


def test_a_token_refusal_releases_the_slot():
    async def run():
        limiter = TenantLimiter(storage_from_uri("memory://"))
        tenant = Tenant("u", key_digest("k2"), "a", token_limit="100/minute", max_concurrency=1)
        await (await limiter.acquire(tenant, 90)).release()
        with pytest.raises(GatewayError) as e:
            await limiter.acquire(tenant, 20)
        assert e.value.param == "tokens" and await limiter.in_flight(tenant) == 0
        with pytest.raises(GatewayError) as e:
            await limiter.acquire(tenant, 101)
        assert e.value.status == 400 and e.value.param == "max_tokens"

    asyncio.run(run())


def test_redis_uri_uses_redis_py():
    storage = storage_from_uri("redis://127.0.0.1:1/0")
    assert type(storage).__module__ == "limits.aio.storage.redis"  # asyncio storage (the server awaits it)
    assert "redispy" in type(storage.bridge).__name__.lower(), type(storage.bridge)


def test_slot_expiry_is_whole_seconds_as_redis_needs():
    """Redis's EXPIRE (limits' incr script) rejects a float: 'value is not an integer' (seen in compose)."""
    from limits.aio.storage import MemoryStorage

    class RedisLikeStorage(MemoryStorage):
        async def incr(self, key: str, expiry, amount: int = 1) -> int:
            assert isinstance(expiry, int), f"expiry {expiry!r} is not an integer"
            return await super().incr(key, expiry, amount)

    async def run():
        limiter = TenantLimiter(RedisLikeStorage(), slot_ttl_s=900.0)
        await (await limiter.acquire(TENANT, 10)).release()

    asyncio.run(run())
