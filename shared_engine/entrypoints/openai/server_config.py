"""`ServerConfig`: the HTTP server's own settings (the engine's are in `EngineConfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shared_engine.config.validation import check_range
from shared_engine.entrypoints.openai.http_deadlines import ConnectionLimits

API_KEY_ENV = ("SHARED_ENGINE_API_KEY", "VLLM_API_KEY")
CACHE_SALT_SECRET_ENV = "SHARED_ENGINE_CACHE_SALT_SECRET"
LORA_ADMIN_KEY_ENV = "SHARED_ENGINE_LORA_ADMIN_KEY"


@dataclass(frozen=True)
class ServerConfig:
    """`api_key` None leaves the API open (the env vars in `API_KEY_ENV` are the fallback); with a key every
    route needs `Authorization: Bearer <key>` except `api_key_exempt_paths` (comma-separated exact paths).
    `disable_frontend_multiprocessing`: run the engine in a thread of the API server's process instead of
    its own engine core process (vLLM's flag name; one process and one GIL: slower under load).

    Per-request limits (each a 400 naming the field above it, so that one request cannot stall or exhaust
    the engine for everyone): `max_request_body_bytes` (413), `max_n`, `max_stop_strings` and
    `max_stop_string_len` (characters: the detokenizer holds back and searches that many per token),
    `max_stop_token_ids`, `max_prompts_per_request` (a completions prompt list; times `max_n` it is the
    default `max_waiting_requests`), `max_prompt_tokens_per_request` (prompt tokens summed over the
    request's sequences: each prompt counts `n` times), `max_chat_messages` (OpenAI's 2,048) and
`max_content_parts` (summed over the messages), both counted on the raw JSON before it is validated
(body_precheck.py). Requests with more than `large_input_bytes` of input (body or prompts) are tokenised
and templated in a lane of their own, at most `max_large_inputs` at a time (running or waiting; 503 past
it: preprocess_pool.py). HTTP framing: `max_header_bytes` (request line and
    headers; 431 above it) and `max_headers` (431 above it). `health_timeout_s`: `/health` answers 503 when
    the engine has unfinished work and no step has completed for this long (a hung step).
    `cache_salt_from_api_key`: every request's `cache_salt` is derived from the bearer token it presents
    (HMAC-SHA256 under `cache_salt_secret`, env fallback `SHARED_ENGINE_CACHE_SALT_SECRET`, else a random
    secret per process), mixed with the salt the request gives: tenants with different keys never share
    prefix-cache blocks, so `cached_tokens` reveals nothing about another tenant's prompts.

    Multi-LoRA (with the engine's `enable_lora`): `lora_modules` ["name=path", ...] are served from the start
    (vLLM's `--lora-modules`). `allow_runtime_lora_updating` turns on `POST /v1/load_lora_adapter` and
    `/v1/unload_lora_adapter` (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING), which need `Authorization: Bearer
    <lora_admin_key>` (env fallback `SHARED_ENGINE_LORA_ADMIN_KEY`): a key of their own, so holders of the
    users' `api_key` cannot change what is served. The server refuses to start with runtime updating on and
    no admin key."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    api_key_exempt_paths: str = "/health,/metrics"
    max_request_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    max_stop_strings: int = 16
    max_stop_string_len: int = 256
    max_stop_token_ids: int = 64
    max_prompts_per_request: int = 64
    max_prompt_tokens_per_request: int = 131072
    max_chat_messages: int = 2048
    max_content_parts: int = 2048
    large_input_bytes: int = 64 * 1024
    max_large_inputs: int = 4
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_read_timeout_s: float = 10.0
    body_read_timeout_s: float = 30.0
    max_connections: int = 2048
    health_timeout_s: float = 60.0
    uvicorn_log_level: str = "info"
    disable_frontend_multiprocessing: bool = False
    cache_salt_from_api_key: bool = False
    cache_salt_secret: str | None = None
    lora_modules: list[str] | None = None
    allow_runtime_lora_updating: bool = False
    lora_admin_key: str | None = None

    def __post_init__(self) -> None:
        check_range("port", self.port, 0, 65535)
        for name in ("max_request_body_bytes", "max_n", "max_stop_strings", "max_stop_string_len",
                     "max_stop_token_ids", "max_prompts_per_request", "max_prompt_tokens_per_request",
                     "max_chat_messages", "max_content_parts", "large_input_bytes", "max_large_inputs",
                     "max_header_bytes", "max_headers", "max_connections"):
            check_range(name, getattr(self, name), 1)
        for name in ("health_timeout_s", "header_read_timeout_s", "body_read_timeout_s"):
            check_range(name, getattr(self, name), 0, low_open=True)

    @property
    def connection_limits(self) -> ConnectionLimits:
        """The read deadlines and connection cap for uvicorn's protocol (http_deadlines.py)."""
        return ConnectionLimits(self.header_read_timeout_s, self.body_read_timeout_s, self.max_connections)

    def resolved_cache_salt_secret(self) -> str | None:
        """The secret the per-key salts are derived under: given, from the env, or None (the server then
        draws a random one at startup)."""
        return self.cache_salt_secret or os.environ.get(CACHE_SALT_SECRET_ENV) or None

    def resolved_lora_admin_key(self) -> str | None:
        return self.lora_admin_key or os.environ.get(LORA_ADMIN_KEY_ENV) or None

    def resolved_api_key(self) -> str | None:
        if self.api_key:
            return self.api_key
        return next((os.environ[name] for name in API_KEY_ENV if os.environ.get(name)), None)

    @property
    def exempt_paths(self) -> frozenset[str]:
        """Paths served without the API key."""
        return frozenset(p.strip() for p in self.api_key_exempt_paths.split(",") if p.strip())
