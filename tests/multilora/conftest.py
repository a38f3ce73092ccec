"""Fixtures for the multi-LoRA case's gateway tests: a tenants file, the fake engine and the gateway, each
served by a real uvicorn in a thread."""

from __future__ import annotations

import pytest

from case_multilora.app.server import create_app
from case_multilora.app.settings import GatewaySettings
from case_multilora.app.tenants import Tenant, TenantRegistry, key_digest
from tests.multilora.fake_engine import create_fake_engine
from tests.server.uvicorn_thread import serve_in_thread

KEYS = {"alpha": "sk-alpha", "beta": "sk-beta", "slow": "sk-slow", "tight": "sk-tight"}


def tenants() -> TenantRegistry:
    return TenantRegistry([
        Tenant("alpha", key_digest(KEYS["alpha"]), "upper"),
        Tenant("beta", key_digest(KEYS["beta"]), "french", priority=1),
        Tenant("slow", key_digest(KEYS["slow"]), "json", max_concurrency=1),
        Tenant("tight", key_digest(KEYS["tight"]), "acme", request_limit="2/minute", token_limit="300/minute"),
    ])


@pytest.fixture()
def fake_engine():
    app = create_fake_engine()
    with serve_in_thread(app) as url:
        yield app, url


@pytest.fixture()
def gateway(fake_engine):
    """(gateway app, its URL, the fake engine app); a fresh limiter and metrics registry per test."""
    engine_app, engine_url = fake_engine
    app = create_app(GatewaySettings(engine_url=engine_url, default_max_tokens=64), tenants())
    with serve_in_thread(app) as url:
        yield app, url, engine_app


def auth(name: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[name]}"}
