"""Run an app in this process (its engine started and shut down around the scenario) with an httpx client."""

from __future__ import annotations

import asyncio

import httpx


def run_app(app, scenario):
    """`await scenario(client)` against `app` over ASGI; returns its result."""

    async def main():
        app.state.ctx.async_engine.start(asyncio.get_running_loop())
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
                return await scenario(client)
        finally:
            app.state.ctx.async_engine.shutdown()

    return asyncio.run(main())
