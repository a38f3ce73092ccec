"""`ServerConfig`: the HTTP server's own settings (the engine's are in `EngineConfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shared_engine.config.validation import check_range

API_KEY_ENV = ("SHARED_ENGINE_API_KEY", "VLLM_API_KEY")
CACHE_SALT_SECRET_ENV = "SHARED_ENGINE_CACHE_SALT_SECRET"


@dataclass(frozen=True)
class ServerConfig:
    """`api_key` None leaves `/v1/*` open (the env vars in `API_KEY_ENV` are the fallback).
    `max_request_body_bytes`: larger bodies get 413. `max_n`: cap on `n` (400 above it).
    `disable_frontend_multiprocessing`: run the engine in a thread of the API server's process instead of
    its own engine core process (vLLM's flag name; one process and one GIL: slower under load).
    `cache_salt_from_api_key`: every request's `cache_salt` is derived from the bearer token it presents
    (HMAC-SHA256 under `cache_salt_secret`, env fallback `SHARED_ENGINE_CACHE_SALT_SECRET`, else a random
    secret per process), mixed with the salt the request gives: tenants with different keys never share
    prefix-cache blocks, so `cached_tokens` reveals nothing about another tenant's prompts."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_request_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    uvicorn_log_level: str = "info"
    disable_frontend_multiprocessing: bool = False
    cache_salt_from_api_key: bool = False
    cache_salt_secret: str | None = None

    def __post_init__(self) -> None:
        check_range("port", self.port, 0, 65535)
        check_range("max_request_body_bytes", self.max_request_body_bytes, 1)
        check_range("max_n", self.max_n, 1)

    def resolved_cache_salt_secret(self) -> str | None:
        """The secret the per-key salts are derived under: given, from the env, or None (the server then
        draws a random one at startup)."""
        return self.cache_salt_secret or os.environ.get(CACHE_SALT_SECRET_ENV) or None

    def resolved_api_key(self) -> str | None:
        if self.api_key:
            return self.api_key
        return next((os.environ[name] for name in API_KEY_ENV if os.environ.get(name)), None)
