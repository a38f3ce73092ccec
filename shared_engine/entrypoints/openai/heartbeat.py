"""`Heartbeat`: when the engine loop last showed a sign of life, and a watchdog on the event loop that
declares the engine dead when it has been silent for longer than `timeout_s`.

A step that never returns (a hung kernel, a deadlocked collective, a stopped process) raises nothing: without
this the engine would look healthy while every stream waits forever. The engine loop beats once per
iteration: after every step, and at least every idle wait (0.5 s) when there is nothing to do; the engine
core process sends a heartbeat message while idle. So silence longer than the longest legitimate step means
the loop is stuck. `/health` then answers 503 (the engine is marked dead), every open stream gets the error,
and the orchestrator's liveness probe restarts the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Heartbeat:
    """Beats come from any thread (a float store is atomic under the GIL); the watchdog runs on the loop."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def beat(self) -> None:
        self.last = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since the last beat."""
        return time.monotonic() - self.last

    def watch(self, loop: asyncio.AbstractEventLoop, on_stall: Callable[[float], None]) -> None:
        """Check every `timeout_s / 4` (at most 1 s) on `loop`; call `on_stall(silent seconds)` once, on the
        loop, when the silence passes `timeout_s`. Restarts the clock."""
        self.stop()
        self.beat()
        period = min(1.0, self.timeout_s / 4)

        def check() -> None:
            silent = self.silent_for()
            if silent > self.timeout_s:
                self._timer = None
                on_stall(silent)
            else:
                self._timer = loop.call_later(period, check)

        self._timer = loop.call_later(period, check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
