"""`exit_when_dead`: once the engine is dead, stop the server so that its supervisor restarts it.

A dead engine core (killed, out of memory, a step that raised) leaves the API process alive and answering
503 forever: Docker's `restart:` policy only acts on a process that exits, and a Kubernetes pod without a
liveness probe is never restarted. As vLLM's API server does when its engine core dies, `serve` therefore
shuts down after the engine dies: in-flight requests have already had their error (an SSE error frame or
a 5xx), `/health` answers 503 during `grace_s`, then uvicorn stops and the process exits with status 1
(api_server.run_server). Measured recovery under compose: reliability/faults.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

logger = logging.getLogger("shared_engine.server")

ENGINE_DEAD_GRACE_S = 2.0   # /health answers 503 this long before the server stops
POLL_S = 0.25


async def exit_when_dead(async_engine, stop: Callable[[], None], grace_s: float = ENGINE_DEAD_GRACE_S,
                         poll_s: float = POLL_S) -> None:
    """Poll `async_engine.healthy` every `poll_s` seconds; when it turns False, wait `grace_s`, then `stop()`."""
    while async_engine.healthy:
        await asyncio.sleep(poll_s)
    logger.error("the engine is dead (%s); stopping the server in %.1f s so that its supervisor restarts it",
                 async_engine.error, grace_s)
    await asyncio.sleep(grace_s)
    stop()
