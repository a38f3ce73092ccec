"""`TenantLimiter`: per-tenant request rate, token rate and concurrency, on a `limits` storage (in memory by
default; Redis shares them between gateway replicas).

A request is admitted by `acquire(tenant, tokens)`: one concurrency slot, then one hit on the tenant's request
limit and `tokens` (the prompt estimate plus `max_tokens`) on its token limit (moving windows). A request
refused for concurrency takes nothing from the windows; one refused by the token limit has used a request
hit (attempts count against the request rate). The `Lease` it
returns gives the slot back exactly once, whatever ends the request (completion, a client disconnect, an
engine error): the server calls `release()` from a `finally`; `acquire` itself gives the slot back when anything
after it fails (a refusal, a storage error such as a Redis timeout, a cancellation). A slot counter also
expires `slot_ttl_s` after its last change, so a gateway that dies holding slots cannot lock a tenant out
for longer than that.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import anyio
import limits
from limits.aio import storage as aio_storage
from limits.aio import strategies
from limits.storage import storage_from_string

from .errors import GatewayError, rate_limited
from .tenants import Tenant


def storage_from_uri(uri: str):
    """`memory://` or `redis://...` (redis-py's asyncio client, not coredis)."""
    if uri.startswith("memory://"):
        return aio_storage.MemoryStorage()
    return storage_from_string("async+" + uri, implementation="redispy")


@dataclass
class Lease:
    """One admitted request's concurrency slot; `release()` is idempotent."""

    limiter: TenantLimiter | None
    tenant: Tenant
    released: bool = field(default=False)

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.limiter is not None:
            await self.limiter._release_slot(self.tenant)


class TenantLimiter:
    def __init__(self, storage, slot_ttl_s: int = 900) -> None:
        self.storage = storage
        self.window = strategies.MovingWindowRateLimiter(storage)
        self.slot_ttl_s = int(slot_ttl_s)  # whole seconds: Redis EXPIRE takes an integer
        self._items: dict[str, limits.RateLimitItem] = {}

    def _item(self, spec: str) -> limits.RateLimitItem:
        if spec not in self._items:
            self._items[spec] = limits.parse(spec)
        return self._items[spec]

    async def _retry_after(self, item, tenant: Tenant, kind: str) -> int:
        stats = await self.window.get_window_stats(item, tenant.name, kind)
        return math.ceil(stats.reset_time - time.time())

    async def acquire(self, tenant: Tenant, tokens: int) -> Lease:
        """Admit one request reserving `tokens`, or raise `GatewayError`: 429 with `Retry-After` (seconds) for an
        exhausted limit, 400 for a reservation larger than the tenant's whole token window."""
        if tenant.token_limit is not None:
            item = self._item(tenant.token_limit)
            if tokens > item.amount:
                raise GatewayError(400, f"this request reserves {tokens} tokens (prompt estimate + max_tokens), "
                                   f"more than tenant {tenant.name}'s token limit {tenant.token_limit}", "max_tokens")
        lease = await self._acquire_slot(tenant)  # first: a request refused here takes nothing from the windows
        try:
            if tenant.request_limit is not None:
                item = self._item(tenant.request_limit)
                if not await self.window.hit(item, tenant.name, "requests"):
                    raise rate_limited(f"tenant {tenant.name} is over its request limit {tenant.request_limit}",
                                       "requests", await self._retry_after(item, tenant, "requests"))
            if tenant.token_limit is not None:
                item = self._item(tenant.token_limit)
                if not await self.window.hit(item, tenant.name, "tokens", cost=tokens):
                    raise rate_limited(f"tenant {tenant.name} is over its token limit {tenant.token_limit} "
                                       f"({tokens} tokens reserved by this request)", "tokens",
                                       await self._retry_after(item, tenant, "tokens"))
        except BaseException:  # a refusal, and also a storage error or a cancellation after the slot was taken
            with anyio.CancelScope(shield=True):
                await lease.release()
            raise
        return lease

    async def _acquire_slot(self, tenant: Tenant) -> Lease:
        if tenant.max_concurrency is None:
            return Lease(None, tenant)
        in_flight = await self.storage.incr(self._slot_key(tenant), self.slot_ttl_s, 1)
        if in_flight > tenant.max_concurrency:
            await self.storage.incr(self._slot_key(tenant), self.slot_ttl_s, -1)
            raise rate_limited(f"tenant {tenant.name} has {tenant.max_concurrency} requests in flight, its maximum",
                               "concurrency", 1)
        return Lease(self, tenant)

    async def charge_tokens(self, tenant: Tenant, tokens: int) -> None:
        """Charge `tokens` used beyond the reservation (a prompt longer than its estimate) to the token limit."""
        if tenant.token_limit is not None and tokens > 0:
            await self.window.hit(self._item(tenant.token_limit), tenant.name, "tokens", cost=tokens)

    async def in_flight(self, tenant: Tenant) -> int:
        return int(await self.storage.get(self._slot_key(tenant)) or 0)

    async def _release_slot(self, tenant: Tenant) -> None:
        await self.storage.incr(self._slot_key(tenant), self.slot_ttl_s, -1)

    @staticmethod
    def _slot_key(tenant: Tenant) -> str:
        return f"gateway/in_flight/{tenant.name}"
