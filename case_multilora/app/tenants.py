"""`Tenant` and `TenantRegistry`: who an API key belongs to, which adapter it is served by, and its limits.

The tenants file (YAML) holds no plaintext keys, only their SHA-256 digests:

    tenants:
      - name: acme                       # the engine's `tenant` field (fair-share counter) and metric label
        api_key_sha256: 9f86d0...        # hashlib.sha256(key.encode()).hexdigest()
        adapter: acme                    # the engine's served LoRA name (its --lora-modules); the `model` sent
        request_limit: 60/minute         # `limits` notation: N/second|minute|hour, N per M seconds, ...
        token_limit: 20000/minute        # prompt-token estimate + max_tokens reserved per request
        max_concurrency: 4               # requests in flight at once
        priority: 0                      # the engine's `priority` (--scheduling-policy priority)

Only `name`, `api_key_sha256` and `adapter` are required; a missing limit is no limit.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

import limits
import yaml

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass(frozen=True)
class Tenant:
    name: str
    api_key_sha256: str
    adapter: str
    request_limit: str | None = None
    token_limit: str | None = None
    max_concurrency: int | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_CHARS or len(self.name) > 64:
            raise ValueError(f"tenant name {self.name!r}: 1-64 of [a-z0-9-_]")
        if len(self.api_key_sha256) != 64 or not set(self.api_key_sha256) <= set("0123456789abcdef"):
            raise ValueError(f"tenant {self.name}: api_key_sha256 must be 64 lower-case hex digits")
        if not self.adapter:
            raise ValueError(f"tenant {self.name}: adapter is required")
        for field in ("request_limit", "token_limit"):
            value = getattr(self, field)
            if value is not None:
                try:
                    limits.parse(value)
                except ValueError as e:
                    raise ValueError(f"tenant {self.name}: {field} {value!r} is not a rate ({e})") from None
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"tenant {self.name}: max_concurrency must be >= 1, got {self.max_concurrency}")

    def cache_salt(self, secret: bytes | None) -> str:
        """The engine's `cache_salt` for every request of this tenant: one value per tenant (so its requests
        share prefix-cache blocks and no other tenant's do); an HMAC of the name under `secret` when one is set."""
        if secret:
            return "t-" + hmac.new(secret, self.name.encode(), hashlib.sha256).hexdigest()[:32]
        return "t-" + hashlib.sha256(b"multilora-gateway\0" + self.name.encode()).hexdigest()[:32]


class TenantRegistry:
    """Tenants by key digest. Raises ValueError on duplicate names or keys."""

    def __init__(self, tenants: list[Tenant]) -> None:
        self.tenants = {t.name: t for t in tenants}
        self._by_digest = {t.api_key_sha256: t for t in tenants}
        if len(self.tenants) != len(tenants) or len(self._by_digest) != len(tenants):
            raise ValueError("tenant names and api keys must be unique")

    @classmethod
    def from_file(cls, path: Path) -> TenantRegistry:
        doc = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(doc.get("tenants"), list):
            raise ValueError(f"{path}: a top-level `tenants:` list is required")
        return cls([Tenant(**entry) for entry in doc["tenants"]])

    def lookup(self, api_key: str) -> Tenant | None:
        """The tenant holding `api_key`, or None (a dict lookup on the key's digest: no timing on the key)."""
        return self._by_digest.get(key_digest(api_key))
