"""LoRA adapters over HTTP: the registry built from `--lora-modules`, the adapters' `/v1/models` cards, and
the runtime admin routes `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (vLLM's names and
bodies), installed only with `enable_lora` and `allow_runtime_lora_updating`, behind their own admin key.

A load validates the adapter completely before registering it (400 naming the problem otherwise; the
server keeps serving); a load under a registered name is a new version; an unload stops new requests
(404 from then on) while running requests finish on the adapter they started with.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from shared_engine.entrypoints.openai.errors import APIError, bad_request
from shared_engine.entrypoints.openai.openapi import error_responses
from shared_engine.entrypoints.openai.protocol import ModelCard
from shared_engine.lora.lora_registry import LoRARegistry, parse_lora_modules

ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str


def build_registry(async_engine, model_name: str, server_config) -> LoRARegistry | None:
    """The registry with `--lora-modules` loaded, or None without `enable_lora`.

    Raises:
        ValueError: `--lora-modules` without `enable_lora`, a malformed entry, a bad adapter (the message
            names it), or runtime updating on without an admin key.
    """
    lora_config = async_engine.config.lora
    modules = parse_lora_modules(server_config.lora_modules)
    if not lora_config.enable_lora:
        if modules or server_config.allow_runtime_lora_updating:
            raise ValueError("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
        return None
    if server_config.allow_runtime_lora_updating and not server_config.resolved_lora_admin_key():
        raise ValueError("--allow-runtime-lora-updating needs --lora-admin-key (or SHARED_ENGINE_LORA_ADMIN_KEY)")
    registry = LoRARegistry(async_engine.source.arch, lora_config, model_name)
    for name, path in modules:
        try:
            registry.register(name, path)
        except ValueError as exc:
            raise ValueError(f"--lora-modules {name}={path}: {exc}") from exc
    return registry


def adapter_cards(registry: LoRARegistry | None, model_name: str, max_model_len: int) -> list[ModelCard]:
    if registry is None:
        return []
    return [ModelCard(id=a.lora_name, root=a.lora_path, parent=model_name, max_model_len=max_model_len)
            for a in registry.adapters()]


def install_lora_routes(app: FastAPI, registry: LoRARegistry, admin_key: str) -> None:
    expected = f"Bearer {admin_key}".encode()

    def check_admin(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise APIError(401, "missing or invalid LoRA admin key (Authorization: Bearer <lora_admin_key>)",
                           headers={"WWW-Authenticate": "Bearer"})

    @app.post("/v1/load_lora_adapter", responses=error_responses(400, 401), summary="Load a LoRA adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request):
        check_admin(request)
        try:
            lora = await asyncio.to_thread(registry.register, body.lora_name, body.lora_path)
        except ValueError as exc:
            raise bad_request(str(exc), "lora_path") from exc
        return JSONResponse({"object": "lora_adapter", "lora_name": lora.lora_name, "lora_int_id": lora.lora_int_id,
                             "version": lora.version, "message": f"LoRA adapter {lora.lora_name!r} loaded"})

    @app.post("/v1/unload_lora_adapter", responses=error_responses(400, 401, 404), summary="Unload a LoRA adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request):
        check_admin(request)
        try:
            lora = registry.unregister(body.lora_name)
        except KeyError:
            raise APIError(404, f"The LoRA adapter `{body.lora_name}` is not loaded.", "lora_name") from None
        return JSONResponse({"object": "lora_adapter", "lora_name": lora.lora_name,
                             "message": f"LoRA adapter {lora.lora_name!r} unloaded"})
