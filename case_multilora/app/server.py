"""The gateway (FastAPI): `POST /v1/chat/completions`, `POST /v1/completions` (streamed or not), `GET /v1/models`,
`GET /health`, `GET /metrics`.

Per request: the bearer key names the tenant (401 otherwise), the body is rewritten (proxy.py: the tenant's
adapter, cache salt, tenant and priority), the tenant's limits admit it (limiter.py: 429 + `Retry-After`), and
the engine's answer is relayed: JSON as is, a stream event by event as it arrives (SSE, relay.py). Whatever
ends the request, its concurrency slot is released once, in `_finish` (completion, client disconnect, engine
error or timeout), and the per-tenant metrics (metrics.py) are updated. An engine that cannot be reached is a
502; an engine error is passed on with its own status and envelope. The engine connection pool
(`engine_max_connections`) is larger than all open streams, so no request waits for a connection.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .errors import GatewayError, error_body
from .limiter import Lease, TenantLimiter, storage_from_uri
from .metrics import GatewayMetrics
from .proxy import parse_body, rewrite_body, used_tokens
from .relay import SseRelay
from .settings import GatewaySettings
from .tenants import Tenant, TenantRegistry

logger = logging.getLogger("case_multilora.gateway")


class _LeasedStream(StreamingResponse):
    """A StreamingResponse that runs `on_close` however the response ends (also when the client went away
    before the first byte, or a write to a closed connection raised)."""

    def __init__(self, content, on_close, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


class Gateway:
    def __init__(self, settings: GatewaySettings, tenants: TenantRegistry, limiter: TenantLimiter,
                 metrics: GatewayMetrics, client: httpx.AsyncClient) -> None:
        self.settings, self.tenants, self.limiter, self.metrics, self.client = (settings, tenants, limiter,
                                                                                 metrics, client)
        secret = settings.cache_salt_secret
        self.salts = {t.name: t.cache_salt(secret.encode() if secret else None) for t in tenants.tenants.values()}
        self.engine_headers = {"Authorization": f"Bearer {settings.engine_api_key}"} if settings.engine_api_key else {}

    def authenticate(self, request: Request) -> Tenant:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        tenant = self.tenants.lookup(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if tenant is None:
            raise GatewayError(401, "missing or unknown API key (Authorization: Bearer <key>)")
        return tenant

    async def read_body(self, request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.settings.max_body_bytes:
            raise GatewayError(413, f"the body is larger than {self.settings.max_body_bytes} bytes")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > self.settings.max_body_bytes:
                raise GatewayError(413, f"the body is larger than {self.settings.max_body_bytes} bytes")
        return parse_body(bytes(raw))

    async def handle(self, request: Request, route: str) -> Response:
        arrived = time.monotonic()
        tenant = None
        try:
            tenant = self.authenticate(request)
            body = await self.read_body(request)
            plan = rewrite_body(body, tenant, self.salts[tenant.name], self.settings.default_max_tokens,
                                chat=route == "chat/completions")
            try:
                lease = await self.limiter.acquire(tenant, plan.reserved_tokens)
            except GatewayError:
                raise
            except Exception as e:  # the limits storage (Redis) failed: the limiter gave the slot back
                logger.warning("tenant limits storage failed: %r", e)
                raise GatewayError(503, f"the tenant limits could not be checked ({type(e).__name__}); retry",
                                   headers={"Retry-After": "1"}) from e
        except GatewayError as e:
            label = tenant.name if tenant else "unknown"
            if e.status == 429:
                self.metrics.rate_limited.labels(label, e.param).inc()
            self.metrics.requests.labels(label, str(e.status)).inc()
            return e.response()
        return await self._forward(route, tenant, plan, lease, arrived)

    async def _forward(self, route, tenant, plan, lease: Lease, arrived: float) -> Response:
        metrics = self.metrics
        metrics.in_flight.labels(tenant.name).inc()
        state = {"status": "200", "usage": None, "upstream": None}

        async def finish() -> None:
            if lease.released:
                return
            await lease.release()
            metrics.in_flight.labels(tenant.name).dec()
            metrics.requests.labels(tenant.name, state["status"]).inc()
            metrics.e2e.labels(tenant.name).observe(time.monotonic() - arrived)
            metrics.usage(tenant.name, state["usage"])
            extra = used_tokens(state["usage"]) - plan.reserved_tokens
            if extra > 0:
                await self.limiter.charge_tokens(tenant, extra)
            if state["upstream"] is not None:
                await state["upstream"].aclose()

        try:
            request = self.client.build_request("POST", f"/v1/{route}", json=plan.body, headers=self.engine_headers)
            upstream = state["upstream"] = await self.client.send(request, stream=True)
        except httpx.HTTPError as e:
            state["status"] = "502"
            await finish()
            return GatewayError(502, f"the engine could not be reached: {type(e).__name__}").response()
        try:
            if upstream.status_code != 200 or not plan.stream:
                content = await upstream.aread()
                state["status"] = str(upstream.status_code)
                if upstream.status_code == 200:
                    state["usage"] = json.loads(content).get("usage")
                    metrics.ttft.labels(tenant.name).observe(time.monotonic() - arrived)
                headers = {k: v for k, v in upstream.headers.items() if k.lower() == "retry-after"}
                return Response(content, upstream.status_code, headers=headers, media_type="application/json")
        except (httpx.HTTPError, ValueError) as e:
            state["status"] = "502"
            return GatewayError(502, f"the engine's answer broke off: {type(e).__name__}").response()
        finally:
            if upstream.status_code != 200 or not plan.stream or state["status"] == "502":
                await finish()
        return _LeasedStream(self._relay(upstream, tenant, plan, state, arrived), finish,
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _relay(self, upstream: httpx.Response, tenant: Tenant, plan, state: dict, arrived: float):
        """The engine's SSE events, relayed as they arrive (relay.py: only the first token, usage and error
        chunks are parsed); the usage chunk kept for the metrics (and dropped unless the client asked for it);
        an engine that breaks off mid-stream ends it with an error frame."""
        ttft = self.metrics.ttft.labels(tenant.name)
        relay = SseRelay(plan.client_wants_usage, lambda: ttft.observe(time.monotonic() - arrived))
        try:
            async for data in upstream.aiter_bytes():
                out = relay.feed(data)
                state["usage"] = relay.usage
                if relay.status is not None:
                    state["status"] = relay.status
                if out:
                    yield out
            out = relay.close()
            state["usage"] = relay.usage
            if relay.status is not None:
                state["status"] = relay.status
            if out:
                yield out
        except (httpx.HTTPError, ValueError) as e:
            state["status"] = "502"
            yield f"data: {json.dumps(error_body(502, f'the engine stream broke off: {type(e).__name__}'))}\n\n"


def create_app(settings: GatewaySettings, tenants: TenantRegistry | None = None,
               limiter: TenantLimiter | None = None, metrics: GatewayMetrics | None = None) -> FastAPI:
    tenants = tenants or TenantRegistry.from_file(settings.tenants_file)
    limiter = limiter or TenantLimiter(storage_from_uri(settings.limits_storage_uri))
    metrics = metrics or GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        timeout = httpx.Timeout(settings.engine_timeout_s, connect=10.0)
        pool = httpx.Limits(max_connections=settings.engine_max_connections,
                            max_keepalive_connections=min(256, settings.engine_max_connections))
        async with httpx.AsyncClient(base_url=settings.engine_url, timeout=timeout, limits=pool) as client:
            app.state.gateway = Gateway(settings, tenants, limiter, metrics, client)
            yield

    app = FastAPI(title="multi-LoRA gateway", lifespan=lifespan)
    app.state.metrics, app.state.limiter, app.state.tenants = metrics, limiter, tenants

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await request.app.state.gateway.handle(request, "chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await request.app.state.gateway.handle(request, "completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            tenant = request.app.state.gateway.authenticate(request)
        except GatewayError as e:
            return e.response()
        return JSONResponse({"object": "list", "data": [{"id": tenant.adapter, "object": "model",
                                                         "owned_by": tenant.name}]})

    @app.get("/health")
    async def health(request: Request) -> Response:
        gateway = request.app.state.gateway
        try:
            engine = (await gateway.client.get("/health", timeout=5.0)).status_code
        except httpx.HTTPError:
            engine = None
        status = 200 if engine == 200 else 503
        return JSONResponse({"status": "ok" if status == 200 else "engine unavailable", "engine_status": engine,
                             "tenants": len(tenants.tenants)}, status)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
