"""`GatewaySettings`: the gateway's configuration, read once from the environment.

| variable | default | meaning |
|---|---|---|
| `ENGINE_URL` | `http://127.0.0.1:8000` | the engine's base URL (the gateway adds `/v1/...`) |
| `ENGINE_API_KEY` | unset | bearer token for the engine (its `--api-key`) |
| `TENANTS_FILE` | `case_multilora/tenants.yaml` | the tenants (tenants.py) |
| `LIMITS_STORAGE_URI` | `memory://` | the `limits` storage: `redis://host:6379/0` shares limits between replicas |
| `GATEWAY_CACHE_SALT_SECRET` | unset | HMAC key for the tenants' cache salts (unset: a hash of the name) |
| `GATEWAY_DEFAULT_MAX_TOKENS` | 256 | `max_tokens` for a request that names none (the token limit reserves it) |
| `GATEWAY_MAX_BODY_BYTES` | 1048576 | larger bodies get 413 |
| `GATEWAY_ENGINE_TIMEOUT_S` | 600 | read timeout towards the engine |
| `GATEWAY_ENGINE_MAX_CONNECTIONS` | 2048 | engine connections: each open stream holds one (past it, requests wait) |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class GatewaySettings:
    engine_url: str = "http://127.0.0.1:8000"
    engine_api_key: str | None = None
    tenants_file: Path = CASE_DIR / "tenants.yaml"
    limits_storage_uri: str = "memory://"
    cache_salt_secret: str | None = None
    default_max_tokens: int = 256
    max_body_bytes: int = 1 << 20
    engine_timeout_s: float = 600.0
    engine_max_connections: int = 2048

    def __post_init__(self) -> None:
        if not 1 <= self.default_max_tokens <= 1 << 20:
            raise ValueError(f"GATEWAY_DEFAULT_MAX_TOKENS must be in [1, 2^20], got {self.default_max_tokens}")
        if self.engine_max_connections < 1:
            raise ValueError(f"GATEWAY_ENGINE_MAX_CONNECTIONS must be at least 1, got {self.engine_max_connections}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"GATEWAY_MAX_BODY_BYTES must be at least 1024, got {self.max_body_bytes}")
        if not self.limits_storage_uri.startswith(("memory://", "redis://", "rediss://", "redis+sentinel://")):
            raise ValueError(f"LIMITS_STORAGE_URI must be memory:// or redis://..., got {self.limits_storage_uri}")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GatewaySettings:
        """Raises ValueError for a number that does not parse or is out of range."""
        env = os.environ if env is None else env
        get = lambda name: env.get(name) or None
        kwargs = {"engine_url": get("ENGINE_URL"), "engine_api_key": get("ENGINE_API_KEY"),
                  "tenants_file": Path(get("TENANTS_FILE")) if get("TENANTS_FILE") else None,
                  "limits_storage_uri": get("LIMITS_STORAGE_URI"),
                  "cache_salt_secret": get("GATEWAY_CACHE_SALT_SECRET")}
        for name, field, kind in (("GATEWAY_DEFAULT_MAX_TOKENS", "default_max_tokens", int),
                                  ("GATEWAY_MAX_BODY_BYTES", "max_body_bytes", int),
                                  ("GATEWAY_ENGINE_TIMEOUT_S", "engine_timeout_s", float),
                                  ("GATEWAY_ENGINE_MAX_CONNECTIONS", "engine_max_connections", int)):
            if get(name):
                kwargs[field] = kind(get(name))
        return cls(**{k: v for k, v in kwargs.items() if v is not None})
