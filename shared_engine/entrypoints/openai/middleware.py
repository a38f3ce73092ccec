"""ASGI middleware that answers before any route runs: the API key (401), the number of request headers
(431; their bytes are capped while they are read, http_limits.py) and the request body size (413)."""

from __future__ import annotations

import hmac

from shared_engine.entrypoints.openai.body_precheck import BODY_BYTES_KEY
from shared_engine.entrypoints.openai.errors import error_response


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every path but `exempt_paths` (exact matches; by default /health and
    /metrics, for probes and scrapers), compared in constant time. Everything else reveals or costs
    something: /v1/*, /tokenize and /detokenize (compute), /version (the engine's configuration),
    /openapi.json and /docs. The LoRA admin routes are exempt from it: they check their own admin key."""

    def __init__(self, app, api_key: str, exempt_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.exempt_paths = exempt_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.exempt_paths:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_response(401, "missing or invalid API key (Authorization: Bearer <key>)",
                                          headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class HeaderCountMiddleware:
    """431 for a request with more than `max_headers` headers (any server; uvicorn's httptools protocol
    here already refuses them while reading, http_limits.py)."""

    def __init__(self, app, max_headers: int) -> None:
        self.app = app
        self.max_headers = max_headers

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and len(scope["headers"]) > self.max_headers:
            response = error_response(431, f"more than {self.max_headers} request headers")
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Reads the body (at most `max_bytes`) before the app sees it; larger bodies get 413 whether or not
    they declare a Content-Length. After the body, `receive` passes through (disconnect detection)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending the body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        scope[BODY_BYTES_KEY] = size  # the pre-processing pool's lane (preprocess_pool.py)

        async def replaying_receive():
            return replay.pop() if replay else await receive()

        return await self.app(scope, replaying_receive, send)

    async def _too_large(self, scope, receive, send):
        response = error_response(413, f"the request body is larger than {self.max_bytes} bytes")
        await response(scope, receive, send)
